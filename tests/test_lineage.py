"""Cumulative stages (curriculum §4.2): stage N is stage N-1 plus its declared feature.

For each pair of neighbouring stages we compare the exact source of every top-level
definition. A name may only appear, disappear or change if LINEAGE says so, and a
declared change must really be a change. Banners are checked too: carried sections
keep their order, and only the new stage's banners are new.
"""

import ast
import functools
import re

import pytest

from helpers import AGENTS, all_stages

# For every stage: the top-level names it adds, changes and removes relative to the
# stage before it. Pseudo-names: "<imports>" (all import lines), "<main>" (the
# `if __name__ == "__main__"` block) and "<statement>" for any other top-level
# statement, e.g. "<REGISTRY.register(X)>". s01 is the base and introduces everything.
LINEAGE = {
    "s01_loop": {"base": True},
    "s02_tool_registry": {
        "added": ["COMMANDS['/tools']", "ToolEntry", "ToolRegistry", "REGISTRY", "build_registry", "terminal_available",
                  "unknown_tool_message", "parse_arguments", "argument_problems",
                  "validate_tool_call", "MAX_INVALID_TURNS", "JSON_TYPES",
                  "read_file", "write_file", "patch", "search_files", "searchable_files",
                  "function_schema", "error_result", "parse_result", "classify_tool_result",
                  "bounded_lines", "MAX_LINE_CHARS", "tool_path", "write_text_atomically",
                  "glob_matches", "after_double_stars", "SEARCH_TIMEOUT", "SEARCH_WORKER",
                  "search_timeout_error", "run_search_worker",
                  "tool_may_have_side_effect", "MAX_READ_LINES", "MAX_SEARCH_MATCHES",
                  "MAX_SEARCH_FILE_BYTES", "SKIPPED_DIRS", "show_tools", "toolset_list",
                  "demo_availability", "stubborn_retry", "DOOR_ERRORS"],
        "removed": ["TOOL_SCHEMAS", "TOOL_HANDLERS", "execute_tool_call"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "run_tool_calls", "run_conversation",
                    "Session", "show_event", "run_turn", "HELP_TEXT", "DEMO_INPUTS",
                    "run_demo", "parse_args", "open_session", "OFFLINE_HELP", "offline_plan",
                    "offline_summary", "offline_reply"],
    },
    "s03_session_store": {
        "added": ["COMMANDS['/sessions']", "COMMANDS['/resume']", "STATE_DB_NAME", "SQLITE_TIMEOUT", "SEARCH_RESULTS_MAX", "HISTORY_NOTE",
                  "SCHEMA", "FTS_SCHEMA", "hermes_home", "new_session_id", "is_searchable",
                  "search_words", "CJK_CHARACTER", "casefold", "SessionStore", "like_snippet", "open_store",
                  "RecordedMessages", "ActiveSession", "session_search", "SESSION_SEARCH_ENTRY",
                  "<REGISTRY.register(SESSION_SEARCH_ENTRY)>", "show_sessions", "resume_session",
                  "resume_command", "close_session", "demo_session", "demo_say"],
        "removed": ["demo_availability"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "Session", "open_session", "main",
                    "parse_args", "HELP_TEXT", "DEMO_INPUTS", "run_demo",
                    "OFFLINE_HELP", "offline_plan", "offline_summary"],
    },
    "s04_prompt_builder": {
        "added": ["COMMANDS['/prompt']", "CONTEXT_FILE_NAMES", "CONTEXT_FILE_MAX_CHARS", "MAX_CONTEXT_FILE_BYTES",
                  "_SCAN_MAX_CHARS", "_INVISIBLE", "_EMOJI_SELECTORS", "_GAP", "_WORD", "_FILLER",
                  "_NEGATIONS", "_SECRET_VARIABLE", "_SECRET_FILE", "_near", "THREAT_PATTERNS",
                  "_zh", "_first", "_ORDER", "_SameLine", "_SENDS_SECRET_FILE", "_CURL", "_WGET",
                  "_MARKUP", "_MARKDOWN", "_RENDER_MAX_WORK", "_STYLED_TAG", "_HIDDEN_TEXT",
                  "_COMMENT_KEYWORD", "_TOOL_COMMENT", "_HIDING_STYLE",
                  "hidden_comment_directive", "hidden_element", "STRUCTURE_CHECKS",
                  "is_invisible", "invisible_characters", "normalise_text", "fold_text",
                  "rendered_markup", "find_injection", "cap_context",
                  "read_context_file", "load_context_file", "DEFAULT_IDENTITY", "TOOL_GUIDANCE",
                  "load_identity", "current_directory",
                  "environment_section", "build_system_prompt", "show_prompt",
                  "describe_system_prompt", "CLEAN_AGENTS_MD", "POISONED_AGENTS_MD",
                  "demo_folder"],
        "removed": ["demo_say", "demo_session"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "Session", "HELP_TEXT",
                    "DEMO_INPUTS", "run_demo", "OFFLINE_HELP", "offline_reply"],
    },
    "s05_context_compression": {
        "added": ["COMPRESSION_THRESHOLD", "DEFAULT_CONTEXT_LENGTH", "CHARS_PER_TOKEN",
                  "MESSAGE_OVERHEAD_TOKENS", "SUMMARY_PREFIX", "estimate_tokens",
                  "compress_context", "prune_tool_outputs", "summarise_middle",
                  "call_auxiliary_model", "KEEP_RECENT_MESSAGES", "TAIL_SHARE", "MIN_SUMMARISED_MESSAGES",
                  "PRUNE_MIN_CHARS", "PRUNED_PREFIX", "SUMMARY_INPUT_MESSAGE_CHARS",
                  "SUMMARY_INSTRUCTIONS", "head_end", "tail_start", "unsaved_start",
                  "is_summary", "pruned_placeholder", "summary_request", "call_function",
                  "shortened", "replace_messages", "describe_compression",
                  "show_compression_event", "compress_command", "COMMANDS['/compress']",
                  "DEMO_CONTEXT_LENGTH", "offline_compression_summary", "describe_context"],
        "removed": ["CLEAN_AGENTS_MD", "POISONED_AGENTS_MD", "demo_folder"],
        "changed": ["run_conversation", "RecordedMessages", "Session", "show_event", "run_turn",
                    "parse_args", "open_session", "HELP_TEXT", "run_demo", "DEMO_INPUTS",
                    "STAGE", "STAGE_TITLE", "offline_reply", "OFFLINE_HELP"],
    },
    "s06_error_recovery": {
        "added": ["API_MAX_RETRIES", "RETRY_BASE_DELAY", "RETRY_MAX_DELAY", "RETRY_JITTER",
                  "MAX_RETRY_AFTER", "API_ERROR_RETRYABLE", "ApiErrorClass", "classify_api_error",
                  "show_recovery_note", "RetryPolicy", "backoff_delay", "call_model",
                  "call_fallback", "compress_for_overflow", "IterationBudget",
                  "GUARDRAIL_THRESHOLDS", "call_signature", "tool_call_failed",
                  "GuardrailDecision", "ToolCallGuardrails", "retry_after_seconds",
                  "seconds_until", "response_headers", "error_text", "_CONTEXT_OVERFLOW",
                  "_BILLING", "status_category", "explain_api_failure", "GUARDRAIL_MESSAGES",
                  "guardrail_message", "guardrail_refusal", "guardrail_note",
                  "halt_explanation", "show_recovery", "COMMANDS['/recovery']",
                  "non_negative_int", "retry_policy_from_args", "every_call_answered",
                  "DEMO_BASE_DELAY", "DEMO_TITLES", "recovery_demo_session",
                  "OFFLINE_FAILURES", "offline_failure", "recovery_reply", "stubborn_rerun"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "run_conversation", "run_tool_calls",
                    "HELP_TEXT", "Session", "show_event", "run_turn", "DEMO_INPUTS", "run_demo",
                    "parse_args", "main", "OFFLINE_HELP", "offline_reply", "OfflineHandler",
                    "start_offline_server"],
    },
    "s07_memory": {
        "added": ["MEMORY_DIR_NAME", "MEMORY_FILES", "MEMORY_CHAR_LIMIT", "USER_CHAR_LIMIT",
                  "ENTRY_DELIMITER", "MEMORY_ACTIONS", "SAVED_NOTE", "memory_tool",
                  "find_memory_threats", "MemoryStore", "memory_snapshot_section",
                  "MEMORY_NOTE", "MEMORY_SCHEMA", "MEMORY_ENTRY",
                  "<REGISTRY.register(MEMORY_ENTRY)>", "MAX_MEMORY_FILE_BYTES",
                  "MEMORY_TITLES", "_DELIMITER_LINE", "MemoryFileError", "MemoryWriteError",
                  "char_limit", "usage", "memory_call_problem", "entry_index", "memory_error",
                  "read_entries", "read_memory_file", "memory_block", "shown_entries",
                  "_ENDINGS", "_SENDS", "_SHARES", "_EDITS", "_AGENT_FILE", "_KEY_PREFIXES",
                  "_KEY_NAMES", "_SameClause", "STRICT_THREAT_PATTERNS", "show_memory",
                  "COMMANDS['/memory']",
                  "new_demo_session", "demo_turn", "demo_memory"],
        "changed": ["STAGE", "STAGE_TITLE", "build_system_prompt", "HELP_TEXT",
                    "DEMO_INPUTS", "run_demo", "OFFLINE_HELP", "offline_plan",
                    "offline_summary"],
    },
    "s08_skills": {
        "added": ["SKILLS_DIR_NAME", "SKILL_FILE", "SKILL_NAME", "MAX_SKILL_NAME_CHARS",
                  "MAX_DESCRIPTION_CHARS", "MAX_SKILL_FILE_BYTES", "INDEX_DESCRIPTION_CHARS",
                  "MAX_SKILLS_LISTED", "MAX_SUPPORTING_FILES", "SKILLS_GUIDANCE", "SkillError",
                  "SkillRefused", "skills_index_section", "skills_list", "skill_view",
                  "SKILL_ACTIONS", "skill_manage", "skill_folder", "skill_file",
                  "check_skill_text", "skill_threats", "create_skill", "patch_skill", "delete_skill",
                  "SKILLS_LIST_ENTRY", "SKILL_VIEW_ENTRY", "SKILL_MANAGE_ENTRY",
                  "<REGISTRY.register(SKILLS_LIST_ENTRY)>", "<REGISTRY.register(SKILL_VIEW_ENTRY)>",
                  "<REGISTRY.register(SKILL_MANAGE_ENTRY)>", "REQUIRED_ENV_KEY",
                  "ENV_VARIABLE_NAME", "FRONT_MATTER",
                  "skills_root", "refusal", "read_skill_text", "parse_skill",
                  "front_matter_problem", "yaml_problem", "load_skill", "list_skills",
                  "shown_description", "supporting_files", "show_skills", "COMMANDS['/skills']",
                  "DEMO_SKILL", "POISONED_SKILL", "HAND_MADE_SKILLS", "restarted_session",
                  "skills_part", "skill_summary"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "build_system_prompt", "HELP_TEXT",
                    "DEMO_INPUTS", "run_demo", "OFFLINE_HELP", "offline_plan", "offline_summary"],
    },
    "s09_permission_system": {
        "added": ["Finding", "Rule", "_computed_once", "Call", "MAX_COMMAND_CHARS", "MAX_NESTING_DEPTH",
                  "MAX_COMMANDS", "MAX_TOKENS", "MAX_VALUE_CHARS", "MAX_GLOB_CHARS", "MAX_GLOB_PATTERNS",
                  "MAX_SCRIPT_BYTES", "DANGEROUS_PATTERNS", "TOO_COMPLEX", "normalize_command",
                  "detect_hardline_command", "detect_dangerous_command", "write_targets", "_Analysis",
                  "_analyse", "_analyse_now", "_analyse_cached", "_check", "_ESCAPE_SEQUENCE",
                  "_CONTROL_CHARACTER", "_INVISIBLE_CHARACTER", "_SECOND_READING", "SYSTEM_DIRS",
                  "SYSTEM_WRITE_DIRS", "_BLOCK_DEVICE", "_MKFS", "MKFS_NAMES", "DISK_TOOLS",
                  "DISK_TOOLS_READ_ONLY", "SECRET_DIRS", "SHELL_STARTUP_FILES", "CREDENTIAL_FILE_NAMES",
                  "_A_HOME", "SHELLS", "INTERPRETERS", "FETCHERS", "NETWORK_COMMANDS",
                  "_REMOTE_OR_DECODED", "STDIN_FILES", "DECODERS", "SQL_CLIENTS", "SQL_VERBS",
                  "_SQL_DROP", "_SQL_TRUNCATE", "_SQL_DELETE", "_SQL_WHERE", "_SQL_NOISE", "_sql_blank",
                  "WRAPPERS", "WRAPPER_ONLY_OPTIONS", "KEYWORDS", "NOT_A_COMMAND", "TAKES_VALUE",
                  "PROGRAM_OPTIONS", "HARMLESS_PROGRAMS", "GIT_PROGRAM_SETTINGS", "FIND_FILTERS",
                  "WRITING_COMMANDS", "OUTPUT_OPTIONS", "Arguments", "split_arguments", "first_operand",
                  "uses_option", "has_option", "recursive", "forced", "_rm_kind", "is_system_dir",
                  "names_matching", "_GLOBS_SEEN", "_SYSTEM_DIR_NAMES", "_GLOB", "_EVERYTHING",
                  "_HOME_EXPANSION", "under_system_dir", "deleted_paths", "find_start_points",
                  "find_filtered", "in_home", "chown_to_root_or_system", "world_writable", "shuts_down",
                  "_SHUTDOWN_TARGETS", "asks_for_help", "kill_signal", "_PKILL_VALUES",
                  "kills_every_process", "kills_the_agent", "stops_service", "git_arguments",
                  "pushes_force", "pushes_delete", "deletes_branch", "stops_containers", "formats_device",
                  "sql_texts", "deletes_every_row", "runs_inline_code", "_AWK_RUNS_COMMANDS",
                  "_SED_E_COMMAND", "sed_commands", "replaces_crontab", "runs_windows_shell",
                  "shell_program", "interpreter_base", "interpreter_mode", "program_from_stdin",
                  "runs_remote_code", "sends_credentials", "_Paths", "_environment", "_working_directory",
                  "_paths_for", "_CURRENT_PATHS", "_paths", "resolve", "in_working_directory",
                  "resolutions", "glob_candidates", "_expand_home", "_NOT_NORMAL", "written",
                  "is_block_device", "_DEVICES", "system_file", "sensitive_file", "secret_file",
                  "_in_secret_dir", "KNOWN_PATH_NAMES", "agent_state", "expand_braces", "_BRACES",
                  "command_writes", "downloaded_files", "piped_text", "printed_text", "is_decoder",
                  "reads_secret", "_SECRET_HINT", "_groups", "_rules_for", "_RULES_CACHE", "_RULE_NAMES",
                  "_RULE_ORDER", "_TooComplex", "Word", "_Command", "_State", "_WordBuilder",
                  "expand_word_braces", "_SPLIT", "_BLANKS", "_PLAIN", "_SIMPLE_WORD",
                  "_IN_DOUBLE_QUOTES", "_WORD_END", "_OPERATOR", "_REDIRECTS", "_NAME", "_ASSIGNMENT",
                  "_BACKTICK_BODY", "_ANSI_C_STRING", "_ANSI_C_ESCAPE", "_ANSI_C_LETTERS",
                  "_BRACE_CONTENT", "_SAFE_WORD", "_parse", "script_texts", "written_text", "read_script",
                  "file_head", "is_shell_script", "_few", "known_commands", "is_glob_name", "_line_end",
                  "_command_name", "_quote", "_Parser", "fed_arguments", "git_programs",
                  "EDITORS", "EDITOR_MOVES", "editor_commands", "carried_commands", "TMUX_RUNS", "TMUX_VALUES", "container_command", "programs_named",
                  "_stage_marks", "_ansi_c_character",
                  "APPROVAL_MODES", "APPROVAL_TIMEOUT", "APPROVAL_CHOICES", "YOLO_ON_VALUES",
                  "NOTHING_RAN",
                  "command_gate", "gate_checks", "approve_command", "Permissions",
                  "ApprovalContext", "APPROVAL_CONTEXT", "approval_context", "terminal_tool",
                  "gate_the_terminal_tool", "<gate_the_terminal_tool()>", "gate_refusal",
                  "described", "show_approval_note",
                  "MAX_SHOWN_COMMAND_CHARS", "SMART_REVIEW_MAX_TOKENS", "SMART_REVIEW_PROMPT",
                  "NO_TERMINAL", "NoAnswer", "ask_human", "parse_choice", "show_approval_panel",
                  "shown_command", "HIDDEN_CATEGORIES", "BLANK_LOOKING", "visible", "is_hidden",
                  "read_terminal_answer", "read_line_before", "SECRET_TOKEN", "BEARER_TOKEN",
                  "SECRET_ASSIGNMENT", "SECRET_NAME_PARTS", "redact_secrets", "is_secret_name",
                  "smart_review", "ALLOWLIST_FILE", "MAX_ALLOWLIST_BYTES", "ALLOWLIST_CHANGED",
                  "AllowlistError", "allowlist_path", "policy_files", "read_allowlist",
                  "allowlist_keys", "allowlist_fingerprint", "save_to_allowlist", "write_private_json", "GLOB_CHARACTERS", "UNKNOWN_PART",
                  "CHANGES_FOLDER", "policy_file_written", "policy_target", "READ_ONLY_COMMANDS",
                  "NOT_ONLY_READING", "COMMAND_BREAK", "QUOTING", "IFS_VARIABLE", "UNSEEN_WORD",
                  "only_reads", "policy_named", "WORD_BREAK", "PIECE_BREAK", "ANSI_C_QUOTED",
                  "ANSI_C_CODE", "ansi_c_text", "fixed_part", "could_match",
                  "expand_known_variables", "tilde", "PROTECTED_FOLDERS", "SHELL_START_FILES",
                  "CREDENTIAL_FILES", "PROTECTED_FILES", "write_refusal",
                  "protected_path_problem", "write_root_problem", "scrubbed_environment",
                  "toggle_yolo", "show_permissions", "COMMANDS['/yolo']",
                  "COMMANDS['/permissions']", "permissions_from_args", "existing_folder",
                  "STUB_RM", "no_terminal", "enter_demo_folder", "with_approvals",
                  "demo_nobody_to_ask", "demo_yolo",
                  "OFFLINE_REVIEW_DENY", "OFFLINE_REVIEW_APPROVE", "offline_review"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "CommandStart", "write_file", "patch",
                    "HELP_TEXT", "DEMO_INPUTS", "run_demo", "parse_args", "main", "OFFLINE_HELP",
                    "offline_reply"],
    },
    "s10_subagent_delegation": {
        "added": ["MAX_CHILD_ITERATIONS", "MAX_PARALLEL_CHILDREN", "MAX_CHILD_DEPTH",
                  "MAX_CHILD_ANSWER_CHARS", "DEFAULT_CHILD_TOOLSETS", "DELEGATE_BLOCKED_TOOLS",
                  "PARENT_RESERVE", "CHILD_BUDGET_MODES", "CHILD_APPROVALS", "CHILD_STATUSES",
                  "CHILD_SYSTEM_PROMPT", "delegate_task", "build_child_agent", "Child",
                  "ChildBudget", "run_child", "child_loop", "run_children", "stop_if_requested",
                  "child_state_problem", "partial_answer", "shown_names", "CHILD_STOP_GRACE",
                  "HEARTBEAT_INTERVAL", "HEARTBEAT_STALE_BEATS", "PREVIEW_CHARS", "DELEGATION",
                  "STOP_REQUESTED", "DelegationSettings", "Delegator", "task_specs", "task_spec",
                  "build_children", "toolset_of", "offered_toolsets", "child_tools", "toolsets_problem",
                  "ChildApprovals", "child_event_handler", "call_preview", "preview",
                  "child_recovery", "child_outcome", "child_result", "start_heartbeat",
                  "heartbeat", "stop_children", "DELEGATE_TASK_SCHEMA", "DELEGATE_TASK_ENTRY",
                  "<REGISTRY.register(DELEGATE_TASK_ENTRY)>", "show_child_event", "preview_line",
                  "delegation_summary", "show_delegation", "COMMANDS['/delegation']",
                  "delegation_settings_from_args", "DEMO_NOTES", "demo_parallel", "demo_limits",
                  "demo_budget", "completed_children", "delegation_words"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "run_conversation", "IterationBudget",
                    "wait_for_command", "run_tool_calls", "write_refusal", "approve_command", "ApprovalContext", "Session",
                    "run_turn", "show_event", "main", "parse_args", "HELP_TEXT", "run_demo",
                    "DEMO_INPUTS", "OFFLINE_HELP", "offline_plan", "offline_summary"],
    },
    "s11_config_chain": {
        "added": ["CONFIG_FILE_NAME", "MANAGED_ENV_VAR", "DEFAULT_MANAGED_FILE",
                  "PROFILES_DIR_NAME", "PROFILE_NAME", "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH",
                  "ADDITIVE_KEYS", "SECRET_SHOWN", "Setting", "build_settings", "SETTINGS",
                  "SETTINGS_BY_KEY", "ConfigError", "Entry", "Resolved", "Config", "CONFIG",
                  "load_config", "resolve_settings", "additive", "lock_warnings",
                  "environment_entries", "flag_entries", "profile_home", "managed_file",
                  "YAML_NULL", "VARIABLE", "TRUE_WORDS", "FALSE_WORDS", "read_config_file",
                  "collect_entries", "section_keys", "node_value", "node_kind",
                  "expand_variables",
                  "did_you_mean", "convert", "convert_number", "convert_list", "convert_pair",
                  "in_range", "expected", "apply_limits", "deny_rule_matched", "commands_run",
                  "chain_files", "chain_file_written", "profile_policy_file", "base_home",
                  "CHAIN_ORDER", "show_config", "shown_value", "config_command",
                  "COMMANDS['/config']", "describe_config", "start_with",
                  "permissions_from_config", "delegation_settings_from_config", "DEMO_KEY",
                  "DEMO_LAYERS", "demo_chain", "demo_mistakes", "demo_deny", "demo_deny_turns",
                  "memory_schema", "add_setting_flag", "checked_config", "restore_home",
                  "retry_policy_from_config"],
        "removed": ["MEMORY_SCHEMA", "permissions_from_args", "delegation_settings_from_args",
                    "retry_policy_from_args", "positive_int", "non_negative_int",
                    "existing_folder", "toolset_list"],
        "changed": ["<imports>", "STAGE", "STAGE_TITLE", "MEMORY_ENTRY", "Permissions",
                    "allowlist_keys", "command_gate", "gate_checks", "policy_files",
                    "policy_file_written", "policy_named", "protected_path_problem", "main",
                    "parse_args", "open_session", "HELP_TEXT", "run_demo", "DEMO_INPUTS",
                    "OFFLINE_HELP", "offline_reply"],
    },
    "s12_checkpoints": {
        "added": ["CHECKPOINTS_DIR_NAME", "CHECKPOINT_REFS", "SHORT_ID_CHARS", "MAX_SNAPSHOTS",
                  "MAX_FILES", "MAX_FILE_SIZE_MB", "CheckpointError", "Checkpoint", "Restored",
                  "CheckpointManager", "CHECKPOINTS", "checkpoint_before_change",
                  "checkpoint_before_command", "command_may_change_files", "GIT_TIMEOUT",
                  "MAX_REASON_CHARS", "DEFAULT_EXCLUDES", "EXACT_ATTRIBUTES", "GIT_SETTINGS",
                  "LIST_FORMAT", "RECORD_END", "CHECKPOINT_ID", "LEFT_OUT_LINE",
                  "GIT_OPTION_WITH_VALUE",
                  "GIT_REWRITES", "PROJECT_MARKERS", "project_key", "project_root",
                  "never_checkpointed", "git_environment", "git_command_name",
                  "git_rewrites_files", "numstat_totals", "one_line", "listed_checkpoint",
                  "checked_id", "left_out_note", "show_checkpoint_note", "open_checkpoint_store",
                  "state_folder_exclude", "stage_tree", "look_at_tree", "MAX_NAMED_CHANGES",
                  "nested_repositories", "too_large", "excluded", "prune", "find_checkpoint",
                  "checked_path", "ignored_files", "check_restorable",
                  "checkpoint_store_problem", "remove_stale_lock", "warn_once", "MAX_DIFF_LINES",
                  "CHECKPOINTS_OFF",
                  "use_checkpoints", "checkpoints_from_config", "off_flag", "rollback_command",
                  "COMMANDS['/rollback']", "checkpoint_number", "show_checkpoints",
                  "show_checkpoint_diff", "diff_style", "show_restored", "describe_checkpoints",
                  "DEMO_FILES", "demo_checkpoints", "DEMO_ROLLBACKS", "show_demo_folder"],
        "changed": ["STAGE", "STAGE_TITLE", "write_file", "patch", "write_refusal",
                    "terminal_tool", "build_settings", "flag_entries", "add_setting_flag",
                    "run_turn", "main", "HELP_TEXT", "run_demo", "DEMO_INPUTS",
                    "OFFLINE_HELP", "offline_reply"],
    },
}

BANNER = re.compile(r"^# ── (?:\[(s\d\d)\] )?(.+?) ─+$", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def parsed(source: str) -> ast.Module:
    """A stage's syntax tree, parsed once per test process (0.3 s for s12): each stage is
    checked as the current and as the previous one of a pair, and for its docstring."""
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def top_level_sources(source: str) -> dict[str, str]:
    """Map each top-level name to the exact source text that defines it. Cached: callers
    only read the map."""
    lines = source.splitlines()
    tree = parsed(source)
    found: dict[str, str] = {}

    def text(node) -> str:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(lines[first - 1:node.end_lineno])

    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue                                            # the module docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found["<imports>"] = found.get("<imports>", "") + text(node) + "\n"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = text(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                found[ast.unparse(target)] = text(node)
        elif isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            found["<main>"] = text(node)
        else:                                                   # e.g. REGISTRY.register(...)
            found[f"<{ast.unparse(node)}>"] = text(node)
    return found


def lineage_problems(previous: str, current: str, declared: dict) -> list[str]:
    """Differences between two stage sources that `declared` does not account for."""
    before, after = top_level_sources(previous), top_level_sources(current)
    added = set(after) - set(before)
    removed = set(before) - set(after)
    changed = {name for name in set(before) & set(after) if before[name] != after[name]}
    problems = []
    for kind, actual in (("added", added), ("removed", removed), ("changed", changed)):
        expected = set(declared.get(kind, ()))
        for name in sorted(actual - expected):
            problems.append(f"{name} was {kind} but LINEAGE does not declare it")
        for name in sorted(expected - actual):
            problems.append(f"LINEAGE declares {name} as {kind}, but it was not")
    return problems


def banners(source: str) -> list[tuple[str, str]]:
    return BANNER.findall(source)


def banner_problems(previous: str, current: str, stage_tag: str) -> list[str]:
    old, new = banners(previous), banners(current)
    problems = []
    carried = [b for b in new if b in old]
    if carried != old:
        problems.append(f"carried banners changed or moved: {old} -> {carried}")
    for tag, title in new:
        if (tag, title) not in old and tag != stage_tag:
            problems.append(f"banner '{title}' is new here but tagged [{tag}], not [{stage_tag}]")
    return problems


def read(stage: str) -> str:
    return (AGENTS / f"{stage}.py").read_text(encoding="utf-8")


STAGES = all_stages()
PAIRS = list(zip(STAGES, STAGES[1:]))


def test_every_stage_is_declared():
    assert set(LINEAGE) == set(STAGES)
    assert [s for s in LINEAGE if LINEAGE[s].get("base")] == ["s01_loop"]


@pytest.mark.parametrize("previous,current", PAIRS)
def test_stage_is_previous_plus_declared_changes(previous, current):
    assert lineage_problems(read(previous), read(current), LINEAGE[current]) == []


@pytest.mark.parametrize("previous,current", PAIRS)
def test_banners_are_carried_in_order(previous, current):
    assert banner_problems(read(previous), read(current), current[:3]) == []


@pytest.mark.parametrize("stage", STAGES)
def test_banners_name_a_stage_and_never_say_new(stage):
    source = read(stage)
    found = banners(source)
    assert found, "a stage file must have section banners"
    number = int(stage[1:3])
    for tag, title in found:
        assert "new" not in title.lower().split(), title
        if tag:
            assert int(tag[1:]) <= number, f"banner [{tag}] in {stage}"
    assert found[-1] == ("", "Offline model (not part of the lesson)")


# The "Changes from sNN" list in a stage's docstring. Each entry starts with four spaces:
# the names, then two or more spaces and what changed. Names are separated by commas
# (`run_demo()`, `Session.switch_to()` and `REGISTRY.register(X)` name run_demo, Session
# and the statement <REGISTRY.register(X)>); a trailing comma continues them on the next
# line. "added:" and "removed:" label the added and removed names; the others are changed.
#
#     Changes from s01
#         added: ToolEntry, ToolRegistry, REGISTRY, build_registry(),
#                validate_tool_call(), MAX_INVALID_TURNS
#         removed: TOOL_SCHEMAS, execute_tool_call()   replaced by REGISTRY
#         run_tool_calls()      validates every call first
#                               (a deeper indent continues the description)

ENTRY_NAMES = re.compile(r"^    (\S.*?)(?: {2,}.*)?$")
LABEL = re.compile(r"^(added|removed): *")


def changes_entries(docstring: str) -> list[str]:
    """The name column of each entry in "Changes from", continuations joined."""
    lines = docstring.split("\nChanges from", 1)[-1].split("\n")[1:] if \
        "\nChanges from" in docstring else []
    entries: list[str] = []
    continues = False
    for line in lines:
        if line.strip() and not line.startswith(" "):
            break                                               # the next part: "Run"
        names = ENTRY_NAMES.match(line)
        if continues:
            entries[-1] += " " + line.strip().split("  ")[0]
        elif names:
            entries.append(names.group(1))
        continues = bool(entries) and entries[-1].endswith(",")
    return entries


def listed_names(docstring: str, declared: set[str]) -> dict[str, set[str]]:
    """{"added": names, "removed": names, "changed": names} as the docstring lists them."""
    listed: dict[str, set[str]] = {"added": set(), "removed": set(), "changed": set()}
    for entry in changes_entries(docstring):
        label = LABEL.match(entry)
        kind = label.group(1) if label else "changed"
        for item in entry[label.end() if label else 0:].split(","):
            item = item.strip()
            if not item:
                continue
            if f"<{item}>" in declared:                         # a statement, e.g. a call
                listed[kind].add(f"<{item}>")
            elif item.startswith("<"):
                listed[kind].add(item)
            else:
                listed[kind].add(item.removesuffix("()").split(".")[0])
    return listed


def docstring_problems(docstring: str, declared: dict) -> list[str]:
    everything = {name for kind in ("added", "removed", "changed")
                  for name in declared.get(kind, ())}
    listed = listed_names(docstring, everything)
    problems = []
    for kind in ("added", "removed", "changed"):
        expected = set(declared.get(kind, ()))
        label = "" if kind == "changed" else f" under '{kind}:'"
        for name in sorted(expected - listed[kind]):
            problems.append(f"'Changes from' does not list {name}{label} (LINEAGE: {kind})")
        for name in sorted(listed[kind] - expected):
            problems.append(f"'Changes from' lists {name}{label}, but LINEAGE does not "
                            f"declare it {kind}")
    return problems


@pytest.mark.parametrize("stage", [s for s in STAGES if not LINEAGE.get(s, {}).get("base")])
def test_docstring_lists_exactly_what_lineage_declares(stage):
    docstring = ast.get_docstring(parsed(read(stage))) or ""
    assert docstring_problems(docstring, LINEAGE[stage]) == []


# The mechanism itself must be able to fail: check it on small synthetic stages.

BASE = '"""doc"""\nimport os\n\nA = 1\n\n\ndef f():\n    return 1\n'


def test_mechanism_flags_an_undeclared_change():
    edited = BASE.replace("return 1", "return 2")
    assert lineage_problems(BASE, edited, {}) == ["f was changed but LINEAGE does not declare it"]
    assert lineage_problems(BASE, edited, {"changed": ["f"]}) == []


def test_mechanism_flags_undeclared_additions_removals_and_stale_declarations():
    edited = BASE.replace("A = 1\n", "B = 2\n") + "import sys\n"
    problems = lineage_problems(BASE, edited, {"changed": ["f"]})
    assert "B was added but LINEAGE does not declare it" in problems
    assert "A was removed but LINEAGE does not declare it" in problems
    assert "<imports> was changed but LINEAGE does not declare it" in problems
    assert "LINEAGE declares f as changed, but it was not" in problems


def test_docstring_changes_are_not_code_changes():
    assert lineage_problems(BASE, BASE.replace('"""doc"""', '"""other"""'), {}) == []


def test_docstring_check_wants_exactly_the_declared_names():
    docstring = """s02 · Title.

Changes from s01
    added: ToolEntry, build_registry(),
           REGISTRY.register(ENTRY)
    removed: execute_tool_call()   replaced by the registry
    Session.switch_to()   a description that names run_turn() and other_thing
                          and goes on, with a comma at the end,
    <imports>             json
Run
    python agents/s02.py   with two spaces
"""
    declared = {"added": ["ToolEntry", "build_registry", "<REGISTRY.register(ENTRY)>"],
                "removed": ["execute_tool_call"], "changed": ["Session", "<imports>"]}
    assert docstring_problems(docstring, declared) == []
    wrong_kind = dict(declared, added=declared["added"] + ["execute_tool_call"], removed=[])
    assert docstring_problems(docstring, wrong_kind) == [
        "'Changes from' does not list execute_tool_call under 'added:' (LINEAGE: added)",
        "'Changes from' lists execute_tool_call under 'removed:', but LINEAGE does not "
        "declare it removed"]
    more = dict(declared, changed=["Session", "<imports>", "run_turn"])
    assert docstring_problems(docstring, more) == [
        "'Changes from' does not list run_turn (LINEAGE: changed)"]
    fewer = dict(declared, changed=["<imports>"])
    assert docstring_problems(docstring, fewer) == [
        "'Changes from' lists Session, but LINEAGE does not declare it changed"]
    assert docstring_problems("no list at all", {"changed": ["f"]}) == [
        "'Changes from' does not list f (LINEAGE: changed)"]


def test_banner_check_catches_moved_and_mislabelled_sections():
    one = "# ── [s01] Loop ───\n# ── [s01] CLI ───\n"
    assert banner_problems(one, "# ── [s01] Loop ───\n# ── [s02] Tools ───\n"
                                "# ── [s01] CLI ───\n", "s02") == []
    assert banner_problems(one, "# ── [s01] CLI ───\n# ── [s01] Loop ───\n", "s02") != []
    assert banner_problems(one, one + "# ── [s03] Later ───\n", "s02") != []
