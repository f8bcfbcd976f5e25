def unanswered(messages):
    """Ids of tool calls in `messages` that no tool message answers."""
    asked = [call["id"] for m in messages if m["role"] == "assistant"
             for call in m.get("tool_calls", [])]
    answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    return [call_id for call_id in asked if call_id not in answered]
