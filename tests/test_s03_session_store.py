"""s03: the session store, resume, session_search, and failing safely.

Runs on every stage from s03 up.
"""

import json
import signal
import sqlite3
import threading
import time

import pytest

from fake_openai import FakeOpenAI, call, http_error, reply
from helpers import (clean_env, first_and_newest, fresh_stage, load_stage, pairing_problems,
                     pid_of_running_command, run_main, stages_from, start_agent,
                     started_session, type_line)

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



def rows(db_path, sql):
    db = sqlite3.connect(db_path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


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


# The LIKE search, used where SQLite lacks FTS5, is the hardened edition's only.
LIKE_SEARCH = pytest.param(False, marks=pytest.mark.hardening)


# ── session ids ───────────────────────────────────────────────────────────

def test_ten_thousand_ids_in_one_second_are_all_different(stage, monkeypatch):
    """The clock stands still: every id is made in the same second (issue: 562 ids in one
    second once gave two the same)."""
    monkeypatch.setattr(stage.time, "strftime", lambda pattern: "20261202-093000")
    ids = [stage.new_session_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("20261202-093000-") for i in ids)


def test_children_that_take_an_id_at_the_same_moment_get_different_ids(stage, monkeypatch):
    """s10 starts its children in threads at once; each takes an id."""
    monkeypatch.setattr(stage.time, "strftime", lambda pattern: "20261202-093000")
    start, ids, lock = threading.Barrier(8), [], threading.Lock()

    def child():
        start.wait(timeout=30)
        mine = [stage.new_session_id() for _ in range(500)]
        with lock:
            ids.extend(mine)

    threads = [threading.Thread(target=child) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(ids) == 4000 and len(set(ids)) == 4000


def test_a_session_id_that_is_taken_is_an_error_never_a_merge(stage, db_path):
    store = stage.SessionStore(db_path)
    try:
        store.create_session("20261202-093000-00000000", "m", "s03")
        with pytest.raises(sqlite3.IntegrityError):
            store.create_session("20261202-093000-00000000", "m", "s03")
        assert rows(db_path, "SELECT count(*) FROM sessions") == [(1,)]
    finally:
        store.close()


def test_a_message_number_is_stored_once_per_session(stage, db_path):
    store = stage.SessionStore(db_path)
    try:
        for session_id in ("one", "two"):
            store.create_session(session_id, "m", "s03")
            store.add_message(session_id, 0, {"role": "user", "content": "hi"})
        with pytest.raises(sqlite3.IntegrityError):       # a repeated save fails loudly
            store.add_message("one", 0, {"role": "user", "content": "again"})
        assert store.load_messages("one") == [{"role": "user", "content": "hi"}]
    finally:
        store.close()


# ── storing and restoring ─────────────────────────────────────────────────

def test_store_uses_wal_and_the_documented_tables(stage, db_path):
    store = stage.SessionStore(db_path)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {row[0] for row in store.db.execute("SELECT name FROM sqlite_master")}
    assert {"sessions", "messages", "messages_fts"} <= tables
    columns = {row[1] for row in store.db.execute("PRAGMA table_info(sessions)")}
    assert {"id", "started_at", "ended_at", "title", "model", "source"} <= columns


def test_every_message_is_saved_as_it_is_appended_once_the_model_answered(stage, db_path):
    store = stage.SessionStore(db_path)
    session = recorded_session(stage, store)
    count = lambda: rows(db_path, "SELECT COUNT(*) FROM messages")[0][0]
    session.messages.append({"role": "user", "content": "one"})
    assert count() == 0                     # the model has not answered: no session yet
    assert rows(db_path, "SELECT COUNT(*) FROM sessions") == [(0,)]
    session.messages.append({"role": "assistant", "content": "two"})
    assert count() == len(session.messages)
    session.messages.append({"role": "user", "content": "three"})
    assert count() == len(session.messages)


def test_the_title_is_the_first_user_message(stage, db_path):
    session = recorded_session(stage, stage.SessionStore(db_path))
    for role, text in [("user", "first question"), ("assistant", "a"),
                       ("user", "second question"), ("assistant", "b")]:
        session.messages.append({"role": role, "content": text})
    assert rows(db_path, "SELECT title FROM sessions") == [("first question",)]


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
    session = started_session(stage)
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
    run_main(stage_name, stdin="$ echo remember-me\n", env=env, cwd=tmp_path)
    result = run_main(stage_name, stdin="/sessions\n", env=env, cwd=tmp_path)
    old_id = result.stdout.split("/sessions")[1].split()[0]
    assert "$ echo remember-me" in result.stdout
    result = run_main(stage_name, stdin=f"/resume {old_id}\n/resume nope\n/sessions\n",
                      env=env, cwd=tmp_path)
    assert f"[resumed session {old_id}: " in result.stdout
    assert "error: no saved session 'nope'" in result.stderr
    assert "* " + old_id in result.stdout


@pytest.mark.parametrize("stage_name", STAGES)
def test_the_offline_model_summarises_what_a_search_found(stage_name, tmp_path):
    env = clean_env(LEARN_HERMES_HOME=str(tmp_path / "home"))
    run_main(stage_name, stdin="$ echo the code is pineapple\n", env=env, cwd=tmp_path)
    result = run_main(stage_name, stdin="search pineapple\nsearch zucchini\n", env=env,
                      cwd=tmp_path)
    assert "Found 3 earlier message(s); best match in session " in result.stdout, result.stdout
    assert "Found 0 earlier message(s)." in result.stdout


def test_a_failed_first_turn_leaves_no_session(stage, db_path, monkeypatch):
    """A wrong key or URL must not leave a session that /sessions lists and
    --continue picks up."""
    monkeypatch.setenv("LEARN_HERMES_HOME", str(db_path.parent))
    with FakeOpenAI([http_error(401, "bad key")]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        assert stage.main(["-p", "hello?"]) == 1
    assert rows(db_path, "SELECT COUNT(*) FROM sessions") == [(0,)]
    assert rows(db_path, "SELECT COUNT(*) FROM messages") == [(0,)]
    assert stage.main(["--continue", "-p", "hi"]) == 1       # nothing to continue


def test_a_failed_turn_is_saved_with_the_first_answer(stage, db_path, tmp_path):
    env = clean_env(LEARN_HERMES_HOME=str(db_path.parent))
    with FakeOpenAI([http_error(401, "bad key"), reply("now it works")]) as server:
        env["OPENAI_BASE_URL"] = server.url
        result = run_main(stage, stdin="/sessions\nhello?\n/sessions\nagain\n/sessions\n",
                          env=env, cwd=tmp_path)
    assert result.stdout.count("no saved sessions yet") == 2, result.stdout
    saved = rows(db_path, "SELECT role, content FROM messages WHERE role != 'system' ORDER BY seq")
    assert saved == [("user", "hello?"), ("user", "again"), ("assistant", "now it works")]
    assert rows(db_path, "SELECT title FROM sessions") == [("hello?",)]


def test_the_store_is_closed_on_exit(stage, db_path, tmp_path):
    """Everything is in state.db itself, not only in its write-ahead log."""
    env = clean_env(LEARN_HERMES_HOME=str(db_path.parent))
    result = run_main(stage, "-p", "$ echo saved-for-good", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    wal = db_path.with_name(db_path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    reader = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True)
    try:                                    # immutable: reads state.db, ignores any -wal
        contents = [c for (c,) in reader.execute("SELECT content FROM messages")]
    finally:
        reader.close()
    assert "$ echo saved-for-good" in contents and len(contents) >= 4
    assert stage.ActiveSession.store is None


# ── session_search ────────────────────────────────────────────────────────

def fill(stage, store, text):
    session = recorded_session(stage, store)
    session.messages.append({"role": "user", "content": text})
    session.messages.append({"role": "assistant", "content": "noted"})
    return session.session_id


@pytest.mark.parametrize("use_fts", [True, LIKE_SEARCH])
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


@pytest.mark.parametrize("use_fts", [True, LIKE_SEARCH])
def test_search_skips_system_prompts_and_earlier_search_results(stage, db_path, use_fts):
    store = stage.SessionStore(db_path, use_fts=use_fts)
    said = fill(stage, store, "unique-word zebra")
    searcher = recorded_session(stage, store)
    searcher.messages.append({"role": "user", "content": "look it up"})
    searcher.messages.append({"role": "assistant", "content": "", "tool_calls": []})
    searcher.messages.append({"role": "tool", "tool_call_id": "c",
                              "content": stage.session_search("zebra")})
    prompted = recorded_session(stage, store)
    prompted.messages.append({"role": "system", "content": "Never feed the zebra."})
    prompted.messages.append({"role": "user", "content": "hi"})
    prompted.messages.append({"role": "assistant", "content": "hello"})
    recorded_session(stage, store)
    found = json.loads(stage.session_search("zebra"))["results"]
    assert [(r["session_id"], r["role"]) for r in found] == [(said, "user")]


@pytest.mark.parametrize("use_fts", [True, LIKE_SEARCH])
def test_search_words_are_words_not_patterns(stage, db_path, use_fts):
    """In LIKE, _ and % are wildcards: the query s_c must not find "sec"."""
    store = stage.SessionStore(db_path, use_fts=use_fts)
    fill(stage, store, "the sec team")
    literal = fill(stage, store, "a s_c file")
    recorded_session(stage, store)
    found = json.loads(stage.session_search("s_c"))["results"]
    assert [r["session_id"] for r in found] == [literal]


CJK_TEXT = "我们决定使用数据库迁移工具"      # "we decided to use a database migration tool"
RUSSIAN_TEXT = "Инструмент миграции базы данных выбран"   # "the migration tool is chosen"
WORDS_IN_SENTENCES = [  # (query, found in CJK_TEXT or RUSSIAN_TEXT?)
    ("数据库", True), ("数据", True), ("迁移 数据库", True), ("数据库迁移工具", True),
    ("数据库 Fridays", False), ("数据表", False),
    ("инструмент", True), ("МИГРАЦИИ", True), ("Базы данных", True), ("миграция", False)]


@pytest.mark.hardening
@pytest.mark.parametrize("use_fts", [True, LIKE_SEARCH])
def test_search_finds_chinese_and_russian_words_inside_a_sentence(stage, db_path, use_fts):
    store = stage.SessionStore(db_path, use_fts=use_fts)
    chinese, russian = fill(stage, store, CJK_TEXT), fill(stage, store, RUSSIAN_TEXT)
    fill(stage, store, "the deploy key rotates on Fridays")
    recorded_session(stage, store)
    for query, found in WORDS_IN_SENTENCES:
        results = json.loads(stage.session_search(query))["results"]
        expected = [chinese if "\u4e00" <= query[0] <= "\u9fff" else russian] if found else []
        assert [r["session_id"] for r in results] == expected, query
        if found:
            snippet = results[0]["snippet"].replace("[", "").replace("]", "")   # FTS marks
            assert snippet in (CJK_TEXT, RUSSIAN_TEXT), query


# The schema as the first release of s03 created it: such databases must keep working.
FIRST_SCHEMA = """
CREATE TABLE sessions (id TEXT PRIMARY KEY, started_at REAL NOT NULL, ended_at REAL,
    title TEXT, model TEXT, source TEXT);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id), seq INTEGER NOT NULL,
    role TEXT NOT NULL, content TEXT, tool_calls TEXT, tool_call_id TEXT,
    searchable INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL, UNIQUE (session_id, seq));
CREATE VIRTUAL TABLE messages_fts USING fts5(content, message_id UNINDEXED);
INSERT INTO sessions VALUES ('old', 1.0, 2.0, 'old title', 'm', 's03');
INSERT INTO messages VALUES (1, 'old', 0, 'user', '我们决定使用数据库迁移工具', NULL, NULL, 1, 1.0);
INSERT INTO messages_fts (content, message_id) VALUES ('我们决定使用数据库迁移工具', 1);
INSERT INTO messages VALUES (2, 'old', 1, 'assistant', 'deploy key rotates', NULL, NULL, 1, 1.0);
INSERT INTO messages_fts (content, message_id) VALUES ('deploy key rotates', 2);
"""


@pytest.mark.parametrize("query", [pytest.param("数据库", marks=pytest.mark.hardening), "deploy"])
def test_a_database_from_the_first_release_still_works(stage, db_path, query):
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as db:
        db.executescript(FIRST_SCHEMA)
    store = stage.SessionStore(db_path)
    recorded_session(stage, store)
    assert [r["session_id"] for r in json.loads(stage.session_search(query))["results"]] \
        == ["old"], query
    assert store.load_messages("old")[0]["content"] == CJK_TEXT


NASTY_QUERIES = ['"unbalanced', "AND", "OR NOT", "*", "zebra*", "(zebra", "zebra)", "NEAR(a b)",
                 "content:zebra", "'; DROP TABLE messages; --", "-zebra", "^zebra", "zebra AND",
                 "💥 zebra", "a" * 5000, "%", "_", "\\"]


@pytest.mark.parametrize("use_fts", [True, LIKE_SEARCH])
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


@pytest.mark.hardening
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


def test_without_fts5_the_teaching_edition_says_so_in_one_line(stage, db_path, monkeypatch):
    """The teaching edition has no second engine: a search is a clear error, never a crash."""
    monkeypatch.setattr(stage, "FTS_SCHEMA",
                        "CREATE VIRTUAL TABLE messages_fts USING no_such_module(content)")
    store = stage.SessionStore(db_path)
    fill(stage, store, "fallback search works")
    recorded_session(stage, store)
    result = json.loads(stage.session_search("fallback"))
    if hasattr(stage, "like_snippet"):          # the hardened edition scans with LIKE
        assert result["results"][0]["snippet"] == "fallback search works"
    else:
        assert result == {"error": "search failed: this Python's SQLite has no FTS5 "
                                   "full-text index"}


@pytest.mark.hardening
@pytest.mark.parametrize("stage_name", [stage for stage in STAGES if "s03" in stage])
def test_the_hardened_demo_shows_the_like_search(stage_name, tmp_path):
    result = run_main(stage_name, "--demo", cwd=tmp_path,
                      env=clean_env(HOME=str(tmp_path), LEARN_HERMES_HOME=str(tmp_path / "h")))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "Without FTS5, a search falls back to LIKE" in result.stdout
    summary = result.stdout.split("falls back to LIKE", 1)[1]
    assert "launch code" in summary and "Found 0" not in summary


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
    result = run_main(stage_name, stdin="$ echo still-here\n/sessions\n",
                      env=clean_env(LEARN_HERMES_HOME=str(home)), cwd=tmp_path)
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "session store unavailable" in warnings[0]
    assert "still-here" in result.stdout and "Traceback" not in result.stderr
    if before is not None:
        assert (home / "state.db").read_bytes() == before     # changes nothing


@pytest.mark.parametrize("stage_name", STAGES)
def test_a_database_locked_by_another_process_warns_once(stage_name, tmp_path):
    """The lock is held by a second connection: SQLite treats it like another process."""
    home = tmp_path / "home"
    stage = fresh_stage(stage_name)
    stage.SQLITE_TIMEOUT = 0.05             # how long it waits for the lock is not the point
    stage.SessionStore(home / "state.db").close()
    locker = sqlite3.connect(home / "state.db")
    locker.execute("BEGIN EXCLUSIVE")
    try:
        result = run_main(stage, stdin="$ echo locked-out\n$ echo again\n",
                          env=clean_env(LEARN_HERMES_HOME=str(home)), cwd=tmp_path)
    finally:
        locker.rollback()
        locker.close()
    assert result.returncode == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "database is locked" in warnings[0]
    assert result.stdout.count("locked-out") >= 1 and "again" in result.stdout


def test_a_lock_taken_mid_session_warns_once_and_keeps_going(stage, db_path, capsys, monkeypatch):
    monkeypatch.setattr(stage, "SQLITE_TIMEOUT", 0.05)
    store = stage.SessionStore(db_path)
    session = recorded_session(stage, store)
    session.messages.append({"role": "user", "content": "saved"})
    session.messages.append({"role": "assistant", "content": "saved too"})
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


def test_a_ctrl_c_right_after_a_commit_cannot_save_a_message_twice(stage, db_path, capsys):
    """If Ctrl-C landed between a commit and the count of saved messages, the next
    save would repeat a message: "UNIQUE constraint failed", and saving stops."""
    store = stage.SessionStore(db_path)
    session = recorded_session(stage, store)
    commit = store.add_message

    def commit_then_ctrl_c(*args):
        commit(*args)
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, stage.CtrlC.on_sigint)
    try:
        stage.CtrlC.armed = True
        session.messages.append({"role": "user", "content": "one"})
        store.add_message = commit_then_ctrl_c
        try:
            session.messages.append({"role": "assistant", "content": "two"})
        except KeyboardInterrupt:
            pass
        store.add_message = commit
        session.messages.append({"role": "user", "content": "three"})
    finally:
        signal.signal(signal.SIGINT, previous)
        stage.CtrlC.armed = True
    assert "warning" not in capsys.readouterr().err
    assert stage.SessionStore(db_path).load_messages(session.session_id) == session.messages


# ── Ctrl-C, held down: a real process, because only a real process gets signals ──

@pytest.mark.parametrize("stage_name", first_and_newest(STAGES))
def test_six_quick_ctrl_cs_cancel_once_and_the_session_stays_valid(stage_name, tmp_path):
    home = tmp_path / "home"
    proc = start_agent(stage_name, tmp_path, home)
    try:
        type_line(proc, b"$ echo $$ > sleeper.pid && exec sleep 30")
        pid_of_running_command(proc, tmp_path / "sleeper.pid", "the command never started")
        for _ in range(6):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.002)
        out, err = (text.decode("utf-8", "replace")
                    for text in proc.communicate(b"$ echo alive\n", timeout=60))
    finally:
        proc.kill()
    assert "Traceback" not in err and "UNIQUE constraint" not in out + err, err
    assert proc.returncode == 0, err
    assert "turn cancelled" in out and "alive" in out.split("turn cancelled", 1)[1]
    [(session_id,)] = rows(home / "state.db", "SELECT id FROM sessions")
    seqs = [seq for (seq,) in rows(home / "state.db", "SELECT seq FROM messages ORDER BY seq")]
    assert seqs == list(range(len(seqs)))   # nothing lost, nothing saved twice
    messages = load_stage(stage_name).SessionStore(home / "state.db").load_messages(session_id)
    assert pairing_problems(messages) == []
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert "interrupted" in results[0] and "alive" in results[-1] and len(results) == 2


def test_a_state_home_that_is_a_file_is_named_in_one_line(stage, tmp_path):
    """LEARN_HERMES_HOME pointing at a file gave "[Errno 17] File exists" (issue 23): one
    line says what is wrong, nothing runs and the file is left as it was."""
    home = tmp_path / "notes.txt"
    home.write_text("my notes\n")
    result = run_main(stage, "--offline", "-p", "$ echo ran",
                      env=clean_env(LEARN_HERMES_HOME=str(home)))
    assert result.returncode == 1 and "ran" not in result.stdout
    assert result.stderr == (f"error: LEARN_HERMES_HOME ({home}) is a file, not a folder: "
                             f"point it at a folder\n")
    assert home.read_text() == "my notes\n"
