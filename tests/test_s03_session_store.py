"""s03: the session store, resume, session_search, and failing safely.

Runs on every stage from s03 up.
"""

import json
import sqlite3

import pytest

from fake_openai import FakeOpenAI, call, reply
from helpers import clean_env, load_stage, pairing_problems, run_stage, stages_from

STAGES = stages_from("s03")


@pytest.fixture(params=STAGES)
def stage(request):
    module = load_stage(request.param)
    yield module
    module.ActiveSession.store = None       # module state must not leak between tests
    module.ActiveSession.session_id = None


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "home" / "state.db"


def recorded_session(stage, store, client=None):
    stage.ActiveSession.store = store
    return stage.Session(client, "fake-model", "http://unused", 30,
                         stage.REGISTRY.get_definitions(), store)


def converse(stage, session, turns, text="go"):
    """Run one real turn through the loop against the fake server."""
    with FakeOpenAI(turns) as server:
        session.client = stage.make_client(server.url, "k")
        session.messages.append({"role": "user", "content": text})
        stage.run_conversation(session.client, "fake-model", session.messages, tools=session.tools)
    return server


# ── storing and restoring ─────────────────────────────────────────────────

def test_store_uses_wal_and_the_documented_tables(stage, db_path):
    store = stage.SessionStore(db_path)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {row[0] for row in store.db.execute("SELECT name FROM sqlite_master")}
    assert {"sessions", "messages", "messages_fts"} <= tables
    columns = {row[1] for row in store.db.execute("PRAGMA table_info(sessions)")}
    assert {"id", "started_at", "ended_at", "title", "model", "source"} <= columns


def test_every_message_is_saved_as_it_is_appended(stage, db_path):
    store = stage.SessionStore(db_path)
    session = recorded_session(stage, store)
    count = lambda: sqlite3.connect(db_path).execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    assert count() == 0                     # nothing is stored before anything is said
    session.messages.append({"role": "user", "content": "one"})
    assert count() == len(session.messages)
    session.messages.append({"role": "assistant", "content": "two"})
    assert count() == len(session.messages)


def test_resume_restores_the_exact_message_list(stage, db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = recorded_session(stage, stage.SessionStore(db_path))
    calls = [call("terminal", {"command": "echo a"}, "c1"),
             call("write_file", {"path": "x.txt", "content": "é\n'); DROP TABLE messages; --"},
                  "c2")]
    converse(stage, session, [reply("thinking", *calls), reply("done")])
    original = list(session.messages)
    restored = stage.SessionStore(db_path).load_messages(session.session_id)
    assert restored == original
    assert pairing_problems(restored) == []
    assistant = next(m for m in restored if m.get("tool_calls"))
    assert assistant["tool_calls"][1]["function"]["arguments"] == calls[1]["arguments"]


def test_title_and_end_time_are_recorded(stage, db_path, monkeypatch):
    monkeypatch.setenv("LEARN_HERMES_HOME", str(db_path.parent))
    with FakeOpenAI([reply("answer")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["-p", "What is a good first title?"]) == 0
    row = sqlite3.connect(db_path).execute(
        "SELECT title, ended_at, model, source FROM sessions").fetchone()
    assert row[0] == "What is a good first title?"
    assert row[1] is not None and row[3] == stage.STAGE


def test_cli_resume_and_continue_send_the_restored_history(stage, db_path, monkeypatch):
    monkeypatch.setenv("LEARN_HERMES_HOME", str(db_path.parent))
    with FakeOpenAI([reply("first answer"), reply("second"), reply("third")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["-p", "first question"]) == 0
        first_id = stage.SessionStore(db_path).list_sessions()[0][0]
        assert stage.main(["--resume", first_id, "-p", "second question"]) == 0
        assert stage.main(["--continue", "-p", "third question"]) == 0
    contents = [[m["content"] for m in r["messages"] if m["role"] != "system"]
                for r in server.requests]
    assert contents[1] == ["first question", "first answer", "second question"]
    assert contents[2][-2:] == ["second", "third question"] and len(contents[2]) == 5
    assert len(stage.SessionStore(db_path).list_sessions()) == 1


def test_resume_answers_a_tool_call_left_open_by_a_crash(stage, db_path, monkeypatch):
    """A process killed during a tool call saved the call but not its result."""
    store = stage.SessionStore(db_path)
    crashed = recorded_session(stage, store)
    crashed.messages.append({"role": "user", "content": "run it"})
    crashed.messages.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": "lost", "type": "function",
         "function": {"name": "terminal", "arguments": '{"command": "sleep 99"}'}}]})
    monkeypatch.setenv("LEARN_HERMES_HOME", str(db_path.parent))
    with FakeOpenAI([reply("recovered")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["--resume", crashed.session_id, "-p", "again"]) == 0
    sent = server.requests[0]["messages"]
    assert pairing_problems(sent) == []
    assert "interrupted" in next(m for m in sent if m.get("tool_call_id") == "lost")["content"]
    assert pairing_problems(stage.SessionStore(db_path).load_messages(crashed.session_id)) == []


HAND_EDITS = [  # (SQL a curious learner might run, resume works?, /sessions works?)
    ("UPDATE messages SET tool_calls = '[{'", False, True),
    ("UPDATE messages SET tool_calls = '[1]'", True, True),
    ("UPDATE messages SET tool_calls = '5'", True, True),
    ("""UPDATE messages SET tool_calls = '[{"id": ["x"]}]'""", True, True),
    ("UPDATE sessions SET started_at = 'yesterday'", True, False),
]


@pytest.mark.parametrize("edit,resumes,lists", HAND_EDITS)
def test_a_hand_edited_database_gives_clear_errors(stage, db_path, monkeypatch, capsys,
                                                   edit, resumes, lists):
    store = stage.SessionStore(db_path)
    broken = recorded_session(stage, store)
    broken.messages.append({"role": "user", "content": "hi"})
    broken.messages.append({"role": "assistant", "content": "", "tool_calls": []})
    with store.db:
        store.db.execute(edit)
    monkeypatch.setenv("LEARN_HERMES_HOME", str(db_path.parent))
    session = stage.open_session(stage.parse_args([]))
    stage.show_sessions(session, "")
    assert stage.resume_session(session, broken.session_id) is resumes
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert resumes or "error: could not load the session" in err
    assert lists or "error: could not list sessions" in out


@pytest.mark.parametrize("flags", [["--resume", "no-such-session"], ["--continue"]])
def test_resume_of_a_missing_session_is_one_clear_error(stage, db_path, monkeypatch, capsys, flags):
    monkeypatch.setenv("LEARN_HERMES_HOME", str(db_path.parent))
    assert stage.main(flags + ["-p", "hi"]) == 1
    err = capsys.readouterr().err
    expected = ("error: no saved session 'no-such-session' (see /sessions)" if "--resume" in flags
                else "error: there are no saved sessions yet, so nothing to continue")
    assert [line for line in err.splitlines() if line.startswith("error:")] == [expected]
    assert stage.SessionStore(db_path).list_sessions() == []


@pytest.mark.parametrize("stage_name", STAGES)
def test_repl_sessions_and_resume_commands(stage_name, tmp_path):
    env = clean_env(LEARN_HERMES_HOME=str(tmp_path / "home"))
    run_stage(stage_name, stdin="$ echo remember-me\n", env=env, cwd=tmp_path)
    result = run_stage(stage_name, stdin="/sessions\n", env=env, cwd=tmp_path)
    old_id = result.stdout.split("/sessions")[1].split()[0]
    assert "$ echo remember-me" in result.stdout
    result = run_stage(stage_name, stdin=f"/resume {old_id}\n/resume nope\n/sessions\n",
                       env=env, cwd=tmp_path)
    assert f"[resumed session {old_id}: " in result.stdout
    assert "error: no saved session 'nope'" in result.stderr
    assert "* " + old_id in result.stdout


# ── session_search ────────────────────────────────────────────────────────

def fill(stage, store, text):
    session = recorded_session(stage, store)
    session.messages.append({"role": "user", "content": text})
    session.messages.append({"role": "assistant", "content": "noted"})
    return session.session_id


@pytest.mark.parametrize("use_fts", [True, False])
def test_search_finds_other_sessions_never_the_current_one(stage, db_path, use_fts):
    store = stage.SessionStore(db_path, use_fts=use_fts)
    old = fill(stage, store, "the deploy key rotates on Fridays")
    current = recorded_session(stage, store)
    current.messages.append({"role": "user", "content": "when does the deploy key rotate?"})
    result = json.loads(stage.session_search("deploy key"))
    assert result["note"].startswith("Historical context")
    assert [r["session_id"] for r in result["results"]] == [old]
    assert "Fridays" in result["results"][0]["snippet"]
    assert stage.ActiveSession.session_id == current.session_id


def test_search_results_are_not_indexed_again(stage, db_path):
    store = stage.SessionStore(db_path)
    fill(stage, store, "unique-word zebra")
    searcher = recorded_session(stage, store)
    searcher.messages.append({"role": "tool", "tool_call_id": "c",
                              "content": stage.session_search("zebra")})
    recorded_session(stage, store)
    found = json.loads(stage.session_search("zebra"))["results"]
    assert len(found) == 1


NASTY_QUERIES = ['"unbalanced', "AND", "OR NOT", "*", "zebra*", "(zebra", "zebra)", "NEAR(a b)",
                 "content:zebra", "'; DROP TABLE messages; --", "-zebra", "^zebra", "zebra AND",
                 "💥 zebra", "a" * 5000, "%", "_", "\\"]


@pytest.mark.parametrize("use_fts", [True, False])
def test_any_query_text_gives_results_or_a_clear_error(stage, db_path, use_fts):
    store = stage.SessionStore(db_path, use_fts=use_fts)
    fill(stage, store, "zebra crossing AND more")
    recorded_session(stage, store)
    count = lambda: store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    stored = count()
    for query in NASTY_QUERIES:
        data = json.loads(stage.session_search(query))
        assert "results" in data or data["error"].startswith("search failed:"), query
    assert json.loads(stage.session_search("(zebra"))["results"]
    assert json.loads(stage.session_search("*"))["error"] == \
        "search failed: the query has no words to search for"
    assert count() == stored                # and nothing was changed or dropped


def test_fallback_when_fts5_is_missing(stage, db_path, monkeypatch):
    """Simulate a SQLite without FTS5: creating the virtual table fails."""
    monkeypatch.setattr(stage, "FTS_SCHEMA",
                        "CREATE VIRTUAL TABLE messages_fts USING no_such_module(content)")
    store = stage.SessionStore(db_path)
    assert store.has_fts is False
    fill(stage, store, "fallback search works")
    recorded_session(stage, store)
    assert json.loads(stage.session_search("fallback"))["results"][0]["snippet"] == \
        "fallback search works"


def test_limit_is_checked(stage, db_path):
    recorded_session(stage, stage.SessionStore(db_path))
    assert "error" in json.loads(stage.session_search("x", limit=0))
    assert "error" in json.loads(stage.session_search("x", limit=stage.SEARCH_RESULTS_MAX + 1))


def test_session_search_is_offered_only_with_a_store(stage, db_path):
    offered = lambda: {t["function"]["name"] for t in stage.REGISTRY.get_definitions()}
    stage.ActiveSession.store = None
    assert "session_search" not in offered()
    stage.ActiveSession.store = stage.SessionStore(db_path)
    assert "session_search" in offered()


# ── a broken database never stops the agent ───────────────────────────────

def broken_home(tmp_path, kind):
    home = tmp_path / "home"
    if kind == "corrupt":
        home.mkdir()
        (home / "state.db").write_bytes(b"not a database at all " * 200)
    elif kind == "unwritable":
        (tmp_path / "a-file").write_text("x")
        home = tmp_path / "a-file" / "home"          # a folder inside a file: cannot exist
    return home


@pytest.mark.parametrize("stage_name", STAGES)
@pytest.mark.parametrize("kind", ["corrupt", "unwritable"])
def test_broken_database_warns_once_and_the_agent_works(stage_name, tmp_path, kind):
    home = broken_home(tmp_path, kind)
    before = (home / "state.db").read_bytes() if kind == "corrupt" else None
    result = run_stage(stage_name, stdin="$ echo still-here\n/sessions\n",
                       env=clean_env(LEARN_HERMES_HOME=str(home)), cwd=tmp_path)
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "session store unavailable" in warnings[0]
    assert "still-here" in result.stdout and "Traceback" not in result.stderr
    if before is not None:
        assert (home / "state.db").read_bytes() == before     # changes nothing


@pytest.mark.parametrize("stage_name", STAGES)
def test_a_database_locked_by_another_process_warns_once(stage_name, tmp_path):
    home = tmp_path / "home"
    load_stage(stage_name).SessionStore(home / "state.db")
    locker = sqlite3.connect(home / "state.db")
    locker.execute("BEGIN EXCLUSIVE")
    try:
        result = run_stage(stage_name, stdin="$ echo locked-out\n$ echo again\n",
                           env=clean_env(LEARN_HERMES_HOME=str(home)), cwd=tmp_path)
    finally:
        locker.rollback()
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "database is locked" in warnings[0]
    assert result.stdout.count("locked-out") >= 1 and "again" in result.stdout


def test_a_lock_taken_mid_session_warns_once_and_keeps_going(stage, db_path, capsys):
    store = stage.SessionStore(db_path)
    session = recorded_session(stage, store)
    session.messages.append({"role": "user", "content": "saved"})
    stored_before = [m["content"] for m in session.messages]
    locker = sqlite3.connect(db_path)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        session.messages.append({"role": "assistant", "content": "not saved"})
        session.messages.append({"role": "user", "content": "not saved either"})
    finally:
        locker.rollback()
    err = capsys.readouterr().err
    assert err.count("warning: could not save to the session store") == 1
    assert session.messages[-2:] == [{"role": "assistant", "content": "not saved"},
                                     {"role": "user", "content": "not saved either"}]
    assert [m["content"] for m in stage.SessionStore(db_path).load_messages(
        session.session_id)] == stored_before
