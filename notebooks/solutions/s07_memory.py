def room_left(entries, limit):
    """The longest entry that still fits a file holding `entries`."""
    used = len(s07.ENTRY_DELIMITER.join(entries))
    delimiter = len(s07.ENTRY_DELIMITER) if entries else 0      # the new entry's, if any
    return limit - used - delimiter
