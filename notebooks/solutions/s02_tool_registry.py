def word_count(text: str) -> str:
    """The word_count tool: {"words": <number of words in text>} as JSON."""
    return json.dumps({"words": len(text.split())})
