def skill_text(name, description, steps):
    """A SKILL.md for `name`: front matter, then the steps numbered from 1."""
    front = f"---\nname: {json.dumps(name)}\ndescription: {json.dumps(description)}\n---\n"
    return front + "".join(f"{number}. {step}\n" for number, step in enumerate(steps, 1))
