def verdict(text):
    """What load_context_file() decided: 'missing', 'skipped', 'blocked' or 'loaded'."""
    if text is None:
        return "missing"
    if text.startswith("[SKIPPED"):
        return "skipped"
    if text.startswith("[BLOCKED"):
        return "blocked"
    return "loaded"
