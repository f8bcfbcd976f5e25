"""s05: context compression. The token estimate and the threshold, pruning before
summarising, safe cuts, one summary that is updated, failures that lose nothing, and
the session store that keeps the full record.

Runs on every stage from s05 up. The summariser is driven through the real openai
client, against tests/fake_openai.py or the stage's own offline model.
"""

import json
import random
import re
import sqlite3

import pytest

from fake_openai import FakeOpenAI, call, http_error, reply
from helpers import (flag_error, load_stage, pairing_problems, repl_output, run_main,
                     stages_from, started_session)

STAGES = stages_from("s05")


@pytest.fixture(params=STAGES)
def stage(request):
    module = load_stage(request.param)
    yield module
    module.ActiveSession.store = None
    module.ActiveSession.session_id = None


@pytest.fixture
def offline(stage):
    """The stage's own offline model and a real client for it."""
    server = stage.start_offline_server()
    yield stage.make_client(server.url, "offline")
    server.shutdown()


_clients: dict = {}


def client_for(stage, server):
    """A real client for `server`. Building one costs 0.2 s (TLS setup), so each stage
    builds one and points a copy of it at each new server."""
    if stage not in _clients:
        _clients[stage] = stage.make_client("http://127.0.0.1:9/v1", "k")
    return _clients[stage].with_options(base_url=server.url)


# ── building conversations ────────────────────────────────────────────────

def user(text):
    return {"role": "user", "content": text}


def answer(text):
    return {"role": "assistant", "content": text}


def asks(*calls):
    """An assistant message with tool calls: (id, command) pairs."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": "terminal",
                                         "arguments": json.dumps({"command": command})}}
                           for call_id, command in calls]}


def writes(call_id, content, path="notes.txt"):
    """An assistant message that writes a file: all of it travels in the arguments."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": "write_file",
                                         "arguments": json.dumps({"path": path,
                                                                  "content": content})}}]}


def result(call_id, content):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def turn(number, output_chars=50, answer_chars=20):
    """One exchange: the user asks, the model runs a command, then answers."""
    call_id = f"c{number}"
    return [user(f"request {number}"), asks((call_id, f"cmd {number}")),
            result(call_id, f"out{number} " + "x" * output_chars),
            answer(f"answer {number} " + "y" * answer_chars)]


def conversation(turns=5, **sizes):
    messages = [{"role": "system", "content": "You are a test agent."}]
    for number in range(1, turns + 1):
        messages += turn(number, **sizes)
    return messages


def events():
    seen = []
    return seen, lambda kind, data: seen.append((kind, data))


def summaries(stage, messages):
    return [m for m in messages if stage.is_summary(m)]


# ── the estimate and the threshold ────────────────────────────────────────

def test_the_documented_numbers(stage):
    assert stage.COMPRESSION_THRESHOLD == 0.50
    assert stage.DEFAULT_CONTEXT_LENGTH == 128_000
    assert stage.CHARS_PER_TOKEN == 4 and stage.MESSAGE_OVERHEAD_TOKENS == 4
    assert stage.KEEP_RECENT_MESSAGES == 6 and stage.TAIL_SHARE == 0.25
    assert stage.MIN_SUMMARISED_MESSAGES == 2
    assert stage.PRUNE_MIN_CHARS == 200 and stage.SUMMARY_INPUT_MESSAGE_CHARS == 2_000


def test_estimate_is_characters_over_four_plus_a_little_per_message(stage):
    assert stage.estimate_tokens([]) == 0
    assert stage.estimate_tokens([user("a" * 400)]) == 100 + 4
    assert stage.estimate_tokens([user("a" * 403)]) == 100 + 4            # rounded down
    # Counted over the whole list, not rounded per message: 2 + 2 characters = 1 token.
    assert stage.estimate_tokens([user("ab"), answer("cd")]) == 1 + 8
    assert stage.estimate_tokens([{"role": "assistant", "content": None}]) == 4
    calls = asks(("c1", "ls -l"))
    as_json = json.dumps(calls["tool_calls"], ensure_ascii=False)
    assert stage.estimate_tokens([calls]) == len(as_json) // 4 + 4
    assert stage.estimate_tokens([dict(calls, content="x" * 40)]) == (len(as_json) + 40) // 4 + 4


def test_estimate_is_too_low_for_chinese(stage):
    """Documented: one token per CJK character in reality, a quarter of it here."""
    assert stage.estimate_tokens([user("数据库" * 100)]) == 75 + 4


def exactly(stage, tokens):
    """A two-message list (nothing to prune or summarise) whose estimate is `tokens`."""
    messages = [{"role": "system", "content": "s"}, user("")]
    padding = (tokens - stage.estimate_tokens(messages)) * 4
    messages[1]["content"] = "w" * padding
    assert stage.estimate_tokens(messages) == tokens
    return messages


@pytest.mark.parametrize("context_length,compressed", [(2000, False), (1998, True),
                                                      (1999, True), (2001, False)])
def test_compression_starts_only_above_half_the_context_length(stage, context_length,
                                                               compressed):
    messages = exactly(stage, 1000)
    before = [dict(m) for m in messages]
    report = stage.compress_context(None, "m", messages, context_length)
    assert (report is not None) == compressed
    assert messages == before                   # nothing here can be pruned or summarised
    if compressed:
        assert report == {"before": 1000, "after": 1000, "limit": context_length // 2,
                          "pruned": 0, "summarised": 0}


def test_without_a_context_length_the_default_applies(stage):
    assert stage.compress_context(None, "m", exactly(stage, 64_000)) is None
    assert stage.compress_context(None, "m", exactly(stage, 64_001))["limit"] == 64_000


def test_force_compresses_below_the_threshold(stage):
    assert stage.compress_context(None, "m", exactly(stage, 10), 128_000) is None
    report = stage.compress_context(None, "m", exactly(stage, 10), 128_000, force=True)
    assert report["before"] == 10 and report["pruned"] == 0


# ── step 1: pruning ───────────────────────────────────────────────────────

def pruned_copy(stage, messages):
    copy = [dict(m) for m in messages]
    stage.prune_tool_outputs(copy, len(copy) - stage.KEEP_RECENT_MESSAGES)
    return copy


def test_pruning_comes_first_and_a_summary_only_if_still_above(stage):
    messages = conversation(5, output_chars=1_000)
    original = [dict(m) for m in messages]
    # Above the threshold with the outputs, exactly at it once they are pruned.
    context_length = 2 * stage.estimate_tokens(pruned_copy(stage, messages))
    seen, on_event = events()
    with FakeOpenAI([]) as server:
        report = stage.compress_context(client_for(stage, server), "m", messages,
                                        context_length, on_event=on_event)
    assert server.requests == []                # no summary was needed: no model call
    assert report["pruned"] == 3 and report["summarised"] == 0
    assert report["after"] == stage.estimate_tokens(messages) < report["before"]
    assert seen == [("compressed", report)]
    assert len(messages) == len(original)
    for before, now in zip(original, messages):
        if now != before:
            assert before["role"] == "tool" and len(before["content"]) > 200
            assert now == dict(before, content=now["content"])
    assert messages[-6:] == original[-6:]       # the newest messages are never pruned


def test_a_summary_follows_when_pruning_is_not_enough(stage):
    messages = conversation(5, output_chars=1_000)
    context_length = 2 * (stage.estimate_tokens(pruned_copy(stage, messages)) - 1)
    report, requests, seen = summarised_by(stage, messages, context_length, [reply("s")])
    assert report["pruned"] == 3 and report["summarised"] > 0 and len(requests) == 1
    assert "[tool] " + stage.PRUNED_PREFIX in requests[0]["messages"][1]["content"]


def test_a_placeholder_says_what_was_removed(stage):
    messages = conversation(3, output_chars=1_000)
    output = messages[3]["content"]
    stage.prune_tool_outputs(messages, len(messages))
    assert messages[3] == result("c1", f"{stage.PRUNED_PREFIX}terminal "
                                       f'{{"command": "cmd 1"}} returned {len(output):,} '
                                       f"characters; run it again if needed]")


def test_only_outputs_longer_than_the_limit_and_before_the_end_are_pruned(stage):
    messages = [user("go"), asks(("a", "x"), ("b", "y"), ("c", "z")),
                result("a", "1" * 200), result("b", "2" * 201), result("c", "3" * 5000),
                user("a" * 5000)]
    assert stage.prune_tool_outputs(messages, 4) == 1
    assert messages[2]["content"] == "1" * 200
    assert messages[3]["content"].startswith(stage.PRUNED_PREFIX)
    assert messages[4]["content"] == "3" * 5000     # at index 4: not before the end
    assert messages[5]["content"] == "a" * 5000     # only tool results are pruned
    assert stage.prune_tool_outputs(messages, 0) == 0


def test_a_placeholder_is_never_pruned_again(stage):
    long_name = {"id": "c", "type": "function",
                 "function": {"name": "n" * 500, "arguments": json.dumps({"a": "b" * 500})}}
    messages = [{"role": "assistant", "content": "", "tool_calls": [long_name]},
                result("c", "x" * 10_000_000)]
    assert stage.prune_tool_outputs(messages, 2) == 1
    assert messages[1]["content"].startswith(f"{stage.PRUNED_PREFIX}{'n' * 80}… returned ")
    assert len(messages[1]["content"]) < stage.PRUNE_MIN_CHARS
    assert stage.prune_tool_outputs(messages, 2) == 0


def test_pruning_survives_odd_tool_calls_of_a_hand_edited_session(stage):
    messages = [{"role": "assistant", "content": "",
                 "tool_calls": ["not a call", {"id": "c", "function": "nope"}]},
                result("c", "x" * 300), result("?", "y" * 300)]
    assert stage.prune_tool_outputs(messages, 3) == 2
    assert "None None returned 300 characters" in messages[1]["content"]
    assert stage.estimate_tokens(messages) > 0
    assert "[assistant calls None] None" in stage.summary_request(None, messages)[1]["content"]


# ── step 2: the summary ───────────────────────────────────────────────────

def summarised_by(stage, messages, context_length, turns, force=False):
    """Compress against a fake server; return (report, requests, events)."""
    seen, on_event = events()
    with FakeOpenAI(turns) as server:
        report = stage.compress_context(client_for(stage, server), "aux-model", messages,
                                        context_length, force=force, on_event=on_event)
    return report, server.requests, seen


def test_the_middle_becomes_one_summary_between_head_and_tail(stage):
    messages = conversation(6, output_chars=100, answer_chars=400)
    messages.append(user("the latest request"))
    original = [dict(m) for m in messages]
    report, requests, _ = summarised_by(stage, messages, 400, [reply("  the summary  ")])
    assert len(requests) == 1
    head = original[:4]                         # system, first request, its call and result
    assert messages[:4] == head
    assert messages[4] == {"role": "user", "content": f"{stage.SUMMARY_PREFIX}\nthe summary"}
    assert messages[-1] == original[-1]
    assert messages == head + [messages[4]] + original[len(original) - len(messages) + 5:]
    assert report["summarised"] == len(original) - len(messages) + 1
    assert report["after"] == stage.estimate_tokens(messages) < report["before"]
    assert pairing_problems(messages) == []


def test_the_summary_request_offers_no_tools_and_carries_the_middle(stage):
    messages = conversation(6, output_chars=100, answer_chars=400)
    messages.append(user("the latest request"))
    original = [dict(m) for m in messages]
    report, requests, _ = summarised_by(stage, messages, 400, [reply("the summary")])
    sent = requests[0]
    assert "tools" not in sent and "tool_choice" not in sent
    assert sent["model"] == "aux-model"
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]
    assert sent["messages"][0]["content"] == stage.SUMMARY_INSTRUCTIONS
    text = sent["messages"][1]["content"]
    assert text.startswith("Messages to summarise:\n")
    middle = original[4:4 + report["summarised"]]
    for message in middle:
        if message["role"] == "tool":
            assert f"[tool] {message['content']}" in text
        elif message.get("tool_calls"):
            arguments = message["tool_calls"][0]["function"]["arguments"]
            assert f"[assistant calls terminal] {arguments}" in text
        else:
            assert f"[{message['role']}] {message['content']}" in text
    for kept in original[:4] + original[4 + report["summarised"]:]:
        assert kept["content"] not in text or kept["content"] == ""


def test_the_summariser_sees_empty_results_but_no_empty_assistant_lines(stage):
    text = stage.summary_request(None, [asks(("c", "true")), result("c", ""), user("")])[1]
    assert text["content"] == ('Messages to summarise:\n[assistant calls terminal] '
                               '{"command": "true"}\n[tool] \n[user] ')


def test_the_summariser_sees_at_most_the_limit_of_one_message(stage):
    request = stage.summary_request(None, [user("a" * 1500 + "b" * 3000)])
    text = request[1]["content"]
    assert stage.SUMMARY_INPUT_MESSAGE_CHARS == 2_000
    assert "a" * 1000 in text and "b" * 2000 not in text
    assert len(text) < len("Messages to summarise:\n[user] ") + 2_000 + 100


@pytest.mark.hardening
def test_the_summariser_sees_the_start_and_the_end_of_a_long_message(stage):
    request = stage.summary_request(None, [user("a" * 1500 + "b" * 3000)])
    text = request[1]["content"]
    assert "a" * 1000 in text and "a" * 1001 not in text and "b" * 1000 in text
    assert "[2500 characters truncated]" in text


def test_a_later_compression_updates_the_summary_and_never_stacks_two(stage):
    messages = conversation(6, output_chars=100, answer_chars=400) + [user("next")]
    summarised_by(stage, messages, 400, [reply("first summary")])
    messages += turn(7, answer_chars=400)[1:] + turn(8, answer_chars=400) + [user("last")]
    report, requests, _ = summarised_by(stage, messages, 400, [reply("second summary")])
    text = requests[0]["messages"][1]["content"]
    assert text.startswith("Previous summary (update it):\nfirst summary\n\nMessages to summarise:\n")
    assert stage.SUMMARY_PREFIX not in text
    assert [m["content"] for m in summaries(stage, messages)] == [
        f"{stage.SUMMARY_PREFIX}\nsecond summary"]
    assert stage.is_summary(messages[4])
    assert report["summarised"] > 0             # the old summary is not counted as a message
    assert pairing_problems(messages) == []


def test_one_message_is_not_worth_a_summary_two_are(stage):
    messages = [user("a" * 400), answer("b" * 400), user("c" * 400)]
    with FakeOpenAI([reply("short")]) as server:
        client = client_for(stage, server)
        assert stage.summarise_middle(client, "m", messages, 0, 1) == 0
        assert server.requests == []
        assert stage.summarise_middle(client, "m", messages, 0, 2) == 2
    assert len(server.requests) == 1 and len(messages) == 2


@pytest.mark.parametrize("shorter_by,accepted", [(0, False), (1, True)])
def test_a_summary_that_saves_nothing_is_refused(stage, shorter_by, accepted):
    messages = [user("a" * 400), answer("b" * 400)]
    original = [dict(m) for m in messages]
    target = stage.estimate_tokens(messages) - shorter_by      # the summary's estimate
    text = "x" * ((target - 4) * 4 - len(stage.SUMMARY_PREFIX) - 1)
    with FakeOpenAI([reply(text)]) as server:
        client = client_for(stage, server)
        if accepted:
            assert stage.summarise_middle(client, "m", messages, 0, 2) == 2
            assert stage.estimate_tokens(messages) == target
        else:
            with pytest.raises(ValueError, match="no shorter than the messages"):
                stage.summarise_middle(client, "m", messages, 0, 2)
            assert messages == original


def test_a_middle_that_is_only_the_summary_is_not_summarised_again(stage):
    messages = conversation(6, output_chars=100, answer_chars=400) + [user("next")]
    summarised_by(stage, messages, 400, [reply("first summary")])
    report, requests, _ = summarised_by(stage, messages, 400, [reply("unused")], force=True)
    assert requests == [] and report["summarised"] == 0
    assert len(summaries(stage, messages)) == 1


def test_only_a_user_message_with_the_prefix_is_a_summary(stage):
    assert stage.is_summary(user(stage.SUMMARY_PREFIX + "\nx"))
    assert not stage.is_summary(answer(stage.SUMMARY_PREFIX + "\nx"))
    assert not stage.is_summary(result("c", stage.SUMMARY_PREFIX))
    assert not stage.is_summary(user("x" + stage.SUMMARY_PREFIX))
    assert not stage.is_summary({"role": "user", "content": None})


# ── where the cuts go ─────────────────────────────────────────────────────

def test_the_head_is_the_system_prompt_and_the_first_exchange(stage):
    system = {"role": "system", "content": "s"}
    assert stage.head_end([]) == 0
    assert stage.head_end([system]) == 1
    assert stage.head_end([system, user("u"), answer("a"), user("v")]) == 3
    assert stage.head_end([user("u"), answer("a"), user("v")]) == 2           # no system prompt
    assert stage.head_end([system, user("u"), user("v"), answer("a")]) == 2   # no answer yet
    calls = asks(("a", "x"), ("b", "y"))
    assert stage.head_end([system, user("u"), calls, result("a", ""), result("b", ""),
                           answer("done")]) == 5      # the call's results belong to it
    assert stage.head_end([system, answer("a")]) == 2


def test_the_tail_takes_the_newest_messages_that_fit_its_budget(stage):
    messages = [{"role": "system", "content": "s"}, user("u"), answer("a")] + \
        [user("q" * 36) if i % 2 == 0 else answer("r" * 36) for i in range(10)]
    each = stage.estimate_tokens([messages[-1]])
    assert each == 13
    assert stage.tail_start(messages, 3, 3 * each) == len(messages) - 3
    assert stage.tail_start(messages, 3, 3 * each - 1) == len(messages) - 2
    assert stage.tail_start(messages, 3, 4 * each) == len(messages) - 4
    assert stage.tail_start(messages, 3, 10_000) == 3       # never into the head
    # Even a budget of nothing keeps the latest user message and what follows it.
    assert stage.tail_start(messages, 3, 0) == len(messages) - 2
    right_after_head = messages[:3] + [user("x" * 400), asks(("c", "ls")), result("c", "o")]
    assert stage.tail_start(right_after_head, 3, 0) == 3


def test_in_a_first_turn_the_tail_keeps_at_least_the_last_call(stage):
    """The latest user message is in the head: the tail still keeps the newest call
    with its results, or a result would be summarised before the model saw it."""
    messages = [{"role": "system", "content": "s"}, user("u"), asks(("a", "x")),
                result("a", "1"), asks(("b", "y"), ("c", "z")), result("b", "2" * 400),
                result("c", "3" * 400)]
    assert stage.tail_start(messages, 4, 0) == 4
    assert stage.tail_start(messages + [answer("done " * 100)], 4, 0) == 7
    assert stage.tail_start(messages[:4], 4, 0) == 4          # all head: no tail


def test_the_tail_keeps_the_latest_user_message_whatever_its_size(stage):
    messages = conversation(3) + [user("z" * 50_000), asks(("d", "ls")), result("d", "ok")]
    assert stage.tail_start(messages, 4, 10) == len(messages) - 3


def test_a_tool_result_never_begins_the_tail(stage):
    messages = [{"role": "system", "content": "s"}, user("u"), answer("a"), user("go"),
                asks(("a", "x"), ("b", "y")), result("a", "1" * 40), result("b", "2" * 40),
                answer("done"), user("next")]
    budget = sum(stage.estimate_tokens([m]) for m in messages[-3:])
    assert stage.tail_start(messages, 3, budget) == 4       # back from result b to the call
    assert stage.tail_start(messages, 3, budget - 1) == 7
    one_result = messages[:4] + [asks(("a", "x")), result("a", "1" * 40), answer("done"),
                                 user("next")]
    budget = sum(stage.estimate_tokens([m]) for m in one_result[-3:])
    assert stage.tail_start(one_result, 3, budget) == 4
    # Without a user message in the list, the cut still moves back to the call.
    no_user = [asks(("a", "x"), ("b", "y")), result("a", "1" * 40), result("b", "2" * 40)]
    assert stage.tail_start(no_user, 0, stage.estimate_tokens(no_user[-1:])) == 0
    assert stage.tail_start(no_user, 0, 0) == 0                 # the last call, at least


def test_the_summary_after_the_head_is_not_the_latest_request(stage):
    summary = user(stage.SUMMARY_PREFIX + "\nold")
    messages = conversation(2)
    with_summary = messages[:4] + [summary] + messages[4:]
    assert stage.tail_start(with_summary, 4, 0) == 6        # turn 2's request, after it
    last = messages[:4] + [summary, answer("a" * 400)]
    assert stage.tail_start(last, 4, 0) == 5                # then at least the last message


def test_a_typed_message_that_looks_like_a_summary_is_a_request(stage):
    """A summary is only ever right after the head; anywhere else the prefix was typed."""
    typed = user(stage.SUMMARY_PREFIX + " Now run the tests.")
    messages = conversation(3, answer_chars=400) + [typed, asks(("z", "ls")), result("z", "ok"),
                                                    answer("done")]
    assert stage.tail_start(messages, 4, 0) == 13
    report, requests, _ = summarised_by(stage, messages, 400, [reply("s")], force=True)
    assert typed in messages and report["summarised"] == 9
    text = requests[0]["messages"][1]["content"]
    assert text.startswith("Messages to summarise:") and typed["content"] not in text


def random_conversation(rng):
    messages = [{"role": "system", "content": "system " * rng.randint(1, 40)}] \
        if rng.random() < 0.8 else []
    calls = 0
    for _ in range(rng.randint(1, 7)):
        messages.append(user("ask " * rng.randint(1, 120)))
        for _ in range(rng.randint(0, 3)):
            ids = [f"call{calls}_{k}" for k in range(rng.randint(1, 3))]
            calls += 1
            if len(ids) == 1 and rng.random() < 0.3:
                messages.append(writes(ids[0], "w" * rng.randint(0, 600)))
            else:
                messages.append(asks(*[(i, "c" * rng.randint(1, 40)) for i in ids]))
            messages += [result(i, "out " * rng.randint(0, 150)) for i in ids]
        if rng.random() < 0.8:
            messages.append(answer("done " * rng.randint(0, 80)))
    return messages


def test_every_cut_is_safe_in_many_generated_conversations(stage):
    """The pure boundary functions, over many shapes and budgets."""
    rng = random.Random(5)
    for _ in range(400):
        messages = random_conversation(rng)
        head = stage.head_end(messages)
        assert head == len(messages) or messages[head]["role"] != "tool"
        start = stage.tail_start(messages, head, rng.randint(0, 2_000))
        assert head <= start <= len(messages)
        assert start == len(messages) or messages[start]["role"] != "tool"
        latest = max(i for i, m in enumerate(messages) if m["role"] == "user")
        assert start <= (latest if latest >= head else max(len(messages) - 1, head))


def same_place(message, original):
    """The same message, perhaps with its bulk pruned: same role, same call ids."""
    ids = lambda m: [call["id"] for call in m.get("tool_calls") or []]          # noqa: E731
    return (message["role"] == original["role"] and ids(message) == ids(original)
            and message.get("tool_call_id") == original.get("tool_call_id")
            and (message["role"] == "tool" or message["content"] == original["content"]))


def test_compression_keeps_every_call_with_its_results_in_many_conversations(stage, offline):
    """Compress generated conversations for real (the offline model summarises), twice:
    the list stays valid, the latest request stays, and there is one summary at most."""
    rng = random.Random(8)
    for _ in range(60):
        messages = random_conversation(rng)
        original = [dict(m) for m in messages]
        latest = [m for m in original if m["role"] == "user"][-1]
        for _ in range(2):
            stage.compress_context(offline, "offline", messages, rng.randint(40, 3_000),
                                   force=rng.random() < 0.5)
            assert pairing_problems(messages) == [], messages
            assert len(summaries(stage, messages)) <= 1
            assert [m for m in messages if m["role"] == "user"
                    and not stage.is_summary(m)][-1] == latest
            assert messages[:1] == original[:1]         # the system prompt (or first message)
            assert messages[-1]["role"] == original[-1]["role"]
            for message in messages:                    # nothing invented but the summary
                assert stage.is_summary(message) or any(same_place(message, m) for m in original)


# Conversations that a forced compression must shrink to less than a quarter.
SHRINKABLE = {
    "long tool outputs": lambda: conversation(8, output_chars=3_000),
    "long answers": lambda: conversation(8, answer_chars=3_000),
    "a file written in the middle": lambda: conversation(2) + [
        user("save it"), writes("w", "x" * 12_000), result("w", "ok"),
        answer("saved")] + conversation(6)[1:],
}


@pytest.mark.parametrize("case", SHRINKABLE)
def test_a_forced_compression_shrinks_what_is_bulky(stage, offline, case):
    messages = SHRINKABLE[case]() + [user("latest")]
    before = stage.estimate_tokens(messages)
    stage.compress_context(offline, "offline", messages, force=True)
    assert stage.estimate_tokens(messages) < before // 4
    assert pairing_problems(messages) == []


# ── the auxiliary call and its failures ───────────────────────────────────

def test_the_auxiliary_call_sends_no_tools_and_returns_the_text(stage):
    with FakeOpenAI([reply("  a title \n")]) as server:
        text = stage.call_auxiliary_model(client_for(stage, server), "aux", [user("hi")])
    assert text == "a title"
    assert server.requests == [{"model": "aux", "messages": [user("hi")],
                                "max_tokens": stage.SUMMARY_MAX_TOKENS}]


@pytest.mark.parametrize("turn", [reply(""), reply("  \n "), http_error(500),
                                  http_error(429, "slow down"), reply("", call("t", {}))])
def test_the_auxiliary_call_fails_loudly(stage, turn):
    with FakeOpenAI([turn]) as server:
        with pytest.raises(stage.openai.OpenAIError):
            stage.call_auxiliary_model(client_for(stage, server), "aux", [user("hi")])


@pytest.mark.parametrize("turn", [http_error(500), reply(""),
                                  {"body": "<html>not an API</html>", "content_type": "text/html"}])
def test_a_failed_summary_loses_nothing_and_warns(stage, turn):
    messages = conversation(6, output_chars=1_000, answer_chars=400) + [user("latest")]
    pruned = pruned_copy(stage, messages)
    report, requests, seen = summarised_by(stage, messages, 400, [turn])
    assert len(requests) == 1
    assert messages == pruned                   # pruned, but nothing summarised away
    assert report["summarised"] == 0 and report["pruned"] == 5
    kinds = [kind for kind, _ in seen]
    assert kinds == ["compression_failed", "compressed"]
    assert seen[0][1]["message"].startswith("could not summarise the conversation (")
    assert seen[0][1]["message"].endswith("); it goes on without a summary")


def test_the_turn_is_still_answered_when_the_summary_fails(stage):
    messages = conversation(6, answer_chars=400) + [user("latest")]
    original = [dict(m) for m in messages]
    seen, on_event = events()
    with FakeOpenAI([http_error(503), reply("the answer")]) as server:
        answer_text = stage.run_conversation(client_for(stage, server), "m", messages,
                                             on_event=on_event, context_length=400)
    assert answer_text == "the answer"
    assert "tools" not in server.requests[0] and "tools" in server.requests[1]
    assert server.requests[1]["messages"] == original           # uncompressed
    assert messages == original + [answer("the answer")]
    assert [kind for kind, _ in seen] == ["compression_failed"]


def test_the_summary_does_not_count_against_the_iteration_limit(stage):
    messages = conversation(6, answer_chars=400) + [user("latest")]
    with FakeOpenAI([reply("summary"), reply("the answer")]) as server:
        answer_text = stage.run_conversation(client_for(stage, server), "m", messages,
                                             max_iterations=1, context_length=400)
    assert answer_text == "the answer"
    assert len(server.requests) == 2
    assert stage.is_summary(server.requests[1]["messages"][4])


def test_the_loop_compresses_before_every_model_call(stage):
    """The first call of a turn fits; a big tool result makes the second one compress."""
    messages = conversation(6, answer_chars=100) + [user("latest")]
    tools = stage.REGISTRY.get_definitions(["terminal"])
    context_length = 2 * stage.estimate_tokens(messages, tools) + 100    # schemas count
    turns = [reply("", call("terminal", {"command": "printf '%0500d' 0"}, "big")),
             reply("summary"), reply("done")]
    with FakeOpenAI(turns) as server:
        stage.run_conversation(client_for(stage, server), "m", messages, tools=tools,
                               context_length=context_length)
    first, summary_request, last = server.requests
    assert not summaries(stage, first["messages"])
    assert "tools" not in summary_request
    assert len(summaries(stage, last["messages"])) == 1
    assert pairing_problems(last["messages"]) == []
    assert last["messages"][-2]["tool_calls"][0]["id"] == "big"


# ── the session store keeps the full record ───────────────────────────────

def recorded(stage, tmp_path, messages):
    """A saved session holding `messages` (all of them already in the store)."""
    store = stage.SessionStore(tmp_path / "state.db")
    recorded_list = stage.RecordedMessages(store, "s1", "m")
    for message in messages:
        recorded_list.append(message)
    return store, recorded_list


def test_a_compressed_list_keeps_saving_new_messages_after_the_stored_ones(stage, tmp_path):
    full = conversation(6, output_chars=1_000, answer_chars=400) + [user("latest")]
    store, messages = recorded(stage, tmp_path, [dict(m) for m in full])
    assert len(store.load_messages("s1")) == len(full)
    summarised_by(stage, messages, 400, [reply("the summary")])
    assert len(messages) < len(full)
    for message in turn(9):
        messages.append(message)
        full.append(message)
    assert store.load_messages("s1") == full    # unpruned, no summary, nothing lost
    seqs = [row[0] for row in store.db.execute("SELECT seq FROM messages ORDER BY seq")]
    assert seqs == list(range(len(full)))


def test_replace_messages_keeps_the_store_count(stage, tmp_path):
    _, messages = recorded(stage, tmp_path, conversation(2))    # 9 stored
    stage.replace_messages(messages, messages[:3])
    assert (messages.saved, messages.seq_offset) == (3, 6)
    plain = [1, 2, 3]
    stage.replace_messages(plain, [4])
    assert plain == [4]


def test_messages_the_store_has_not_saved_are_never_compressed(stage, tmp_path):
    """A new session is saved from the model's first answer on: before that, nothing
    in it may change, or the store would save the compressed text later."""
    store = stage.SessionStore(tmp_path / "state.db")
    messages = stage.RecordedMessages(store, "s1", "m")
    messages.saved = 0                          # as Session.switch_to() does for a new one
    for message in [{"role": "system", "content": "s"}, user("a" * 4000),
                    user("b" * 4000), user("c" * 4000)]:
        messages.append(message)
    before = list(messages)
    report, requests, _ = summarised_by(stage, messages, 100, [reply("x")], force=True)
    assert requests == [] and report["summarised"] == 0 and list(messages) == before
    assert stage.unsaved_start(messages) == 0
    messages.store = None                       # saving has stopped: all may be compressed
    assert stage.unsaved_start(messages) == len(messages)
    assert stage.unsaved_start([1, 2]) == 2


def test_a_pending_tool_output_is_neither_pruned_nor_summarised(stage, tmp_path):
    store, messages = recorded(stage, tmp_path,
                               conversation(4, output_chars=1_000, answer_chars=400))
    messages.saved = 6                          # pretend that the rest waits to be saved
    waiting = [dict(m) for m in messages[6:]]
    report, requests, _ = summarised_by(stage, messages, 100, [reply("s")])
    assert report["pruned"] == 1                # turn 1's output; turn 2's (index 7) waits
    assert report["summarised"] == 2            # turn 1's answer and turn 2's request
    assert messages[5:] == waiting


def test_a_compressed_session_resumes_with_its_full_record(stage, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LEARN_HERMES_HOME", str(home))
    lines = ["$ echo one", "$ echo two", "$ echo three", "$ echo four", "context"]
    first = run_main(stage_name(stage), "--context-length", "700",
                     stdin="\n".join(lines) + "\n", cwd=tmp_path,
                     env=env_with_home(home))
    assert first.returncode == 0, first.stderr
    assert "One summary replaced the middle" in first.stdout
    assert "could not save" not in first.stderr
    store = stage.SessionStore(home / "state.db")
    session_id, *_ = store.list_sessions()[0]
    stored = store.load_messages(session_id)
    assert [m["content"] for m in stored if m["role"] == "user"] == lines
    assert not [m for m in stored if stage.is_summary(m)]
    assert pairing_problems(stored) == []
    again = run_main(stage_name(stage), "--context-length", "700", "--resume", session_id,
                     "-p", "context", cwd=tmp_path, env=env_with_home(home))
    assert again.returncode == 0, again.stderr
    assert f"[resumed session {session_id}: {len(stored)} messages]" in again.stdout
    assert "One summary replaced the middle" in again.stdout
    assert len(store.load_messages(session_id)) == len(stored) + 2


def stage_name(stage):
    return stage.__stage__                              # as helpers.load_stage() named it


def env_with_home(home):
    from helpers import clean_env
    return clean_env(LEARN_HERMES_HOME=str(home), HOME=str(home.parent))


# ── the command line and the REPL ─────────────────────────────────────────

@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5", ""])
def test_context_length_must_be_a_positive_whole_number(stage, value):
    run = run_main(stage_name(stage), "--context-length", value, "-p", "hi")
    assert run.returncode == 2
    assert flag_error(stage, "--context-length") in run.stderr


def test_context_length_reaches_the_session(stage):
    assert started_session(stage).context_length == stage.DEFAULT_CONTEXT_LENGTH
    assert started_session(stage, "--context-length", "5000", "--offline").context_length == 5000
    assert stage.Session(None, "m", "u", 3).context_length == stage.DEFAULT_CONTEXT_LENGTH


def test_the_repl_shows_compression_as_it_happens(stage, tmp_path):
    lines = ["$ seq -s ' ' 1 100", "$ seq -s ' ' 101 200", "$ seq -s ' ' 201 300"]
    schemas = stage.estimate_tokens([], started_session(stage).tools)    # sent every time
    run = run_main(stage_name(stage), "--context-length", str(1000 + 2 * schemas),
                   cwd=tmp_path, stdin="\n".join(lines) + "\n")
    assert run.returncode == 0, run.stderr
    third = repl_output(run.stdout, f"{stage.STAGE}> ", lines[2])
    assert "pruned 1 tool output(s), summarised 0 message(s)]" in third
    assert f"(threshold {500 + schemas:,}): pruned 0 tool output(s), summarised 5 message(s)]" \
        in third
    assert "[context" not in run.stdout.split(lines[2])[0]


def test_compress_forces_it_and_says_what_it_did(stage, tmp_path):
    lines = ["/compress", "$ echo one", "$ echo two", "$ echo three", "/compress", "context"]
    run = run_main(stage_name(stage), stdin="\n".join(lines) + "\n", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    prompt = f"{stage.STAGE}> "
    assert repl_output(run.stdout, prompt, "/compress").startswith(
        "nothing was compressed: [context ")
    forced = repl_output(run.stdout.split("echo three", 1)[1], prompt, "/compress")
    assert forced.startswith("  [context ") and "(threshold 64,000): pruned 0 tool output(s), " \
        "summarised 5 message(s)]" in forced
    assert "nothing was compressed" not in forced
    shown = repl_output(run.stdout, prompt, "context")
    assert "One summary replaced the middle:\n- The user asked: $ echo two" in shown
    assert "$ echo one" not in shown.split("middle:")[1]     # the first exchange is the head


def test_a_failed_summary_is_a_warning_and_the_turn_goes_on(stage, tmp_path):
    script = [reply("a1"), reply("a2"), http_error(500, "summariser down"), reply("a3")]
    lines = [f"question {word} " * 5 for word in ("one", "two", "three")]
    with FakeOpenAI(script) as server:
        run = run_main(stage_name(stage), "--context-length", "100", cwd=tmp_path,
                       stdin="".join(line + "\n" for line in lines),
                       env=env_with_home(tmp_path / "h") | {"OPENAI_BASE_URL": server.url})
    assert run.returncode == 0, run.stderr
    assert "warning: could not summarise the conversation (" in run.stderr
    assert "summariser down" in run.stderr
    assert run.stdout.rstrip().endswith("a3")
    assert [m["content"] for m in server.requests[3]["messages"][1:]] == [
        lines[0], "a1", lines[1], "a2", lines[2]]


def test_help_lists_the_command_and_the_verb(stage):
    assert "/compress" in stage.HELP_TEXT
    assert re.search(r"^  context +the model says what conversation", stage.HELP_TEXT, re.M)
    # What the offline model does not follow gets one line that sends you to /help.
    assert "/help" in stage.OFFLINE_HELP
    assert stage.COMMANDS["/compress"] is stage.compress_command


# ── the offline model ─────────────────────────────────────────────────────

def test_the_offline_summariser_keeps_the_previous_lines_and_adds_new_ones(stage):
    request = stage.summary_request("- The user asked: one", [
        user("two\nmore"), asks(("c", "ls")), result("c", "x"), answer("ok")])
    assert stage.offline_reply(request, [0]) == {"content": (
        '- The user asked: one\n- The user asked: two\n- Called terminal {"command": "ls"}')}
    empty = stage.summary_request(None, [answer("ok")])
    assert stage.offline_reply(empty, [0]) == {"content": "- Nothing to note."}


def test_the_context_verb_reports_what_the_model_received(stage):
    messages = conversation(1, output_chars=1_000)
    stage.prune_tool_outputs(messages, len(messages))
    plain = stage.offline_reply(messages + [user("context")], [0])["content"]
    assert plain == (f"I received 6 messages, about "
                     f"{stage.estimate_tokens(messages + [user('context')]):,} tokens; 1 tool "
                     f"output(s) in them were pruned. There is no summary.")
    with_summary = messages + [user(f"{stage.SUMMARY_PREFIX}\n- did things"), user("context")]
    text = stage.offline_reply(with_summary, [0])["content"]
    assert text.endswith("One summary replaced the middle:\n- did things")
    assert stage.offline_reply([], [0])["content"] == stage.OFFLINE_HELP


@pytest.mark.parametrize("stage_name", ["s05_context_compression",    # later stages' demos differ
                                        "hardened/s05_context_compression"])
def test_the_demo_prunes_then_summarises_then_updates_the_summary(stage_name, tmp_path):
    run = run_main(stage_name, "--demo", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    schemas = load_stage(stage_name).estimate_tokens([], load_stage(stage_name).REGISTRY
                                                      .get_definitions())
    assert (f"A context length of {1000 + 2 * schemas:,} tokens (1,000 for the messages, the "
            f"rest for the tool schemas): compression starts above {500 + schemas:,}.") in out
    pruned = out.index("pruned 1 tool output(s), summarised 0 message(s)]")
    summarised = out.index("pruned 0 tool output(s), summarised 5 message(s)]")
    first, updated = out.split("One summary replaced the middle:")[1:]
    assert pruned < summarised < out.index("One summary replaced the middle:")
    assert "201 300" not in first and "$ seq -s ' ' 201 300" in updated
    assert first.split("\n\n")[0].strip() in updated               # kept, then extended
    assert "The model's list holds 8 messages; the session store holds all 21, the full record" \
        in out
    if stage_name.startswith("hardened/"):                 # its demo resumes the session, too
        assert re.search(r"the session store holds all 21, the full record; resuming loads them "
                         r"all:\n\[resumed session [\w-]+: 21 messages\]\n", out)
    assert list(tmp_path.iterdir()) == []                  # its files stayed in its own folder
