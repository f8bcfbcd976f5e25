def split(messages, budget):
    """(head, middle, tail) of a message list, as compression cuts it."""
    head = s05.head_end(messages)
    tail = s05.tail_start(messages, head, budget)
    return messages[:head], messages[head:tail], messages[tail:]
