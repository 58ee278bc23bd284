"""glob() for `ExecSandboxBackend` as langchain's standard sandbox suite pins it: matches are
paths relative to the search root, directories included and flagged `is_dir`.

Pattern syntax follows deepagents' glob tool description (what the model is told): `*`, `?`,
`[...]`, `**`, `{a,b}`; a pattern without `/` matches a name at any depth, one with `/` matches
the root-relative path, a leading `/` anchors to the root, and dot-names match only a pattern
segment that starts with `.` (`**` does not enter dot-directories).

The walk runs in the guest (`GUEST_SCRIPT`, one JSON object per line); `parse_glob_output` reads
what comes back as untrusted: bounded line count and field sizes, anything malformed is an error.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from deepagents.backends.protocol import ExecuteResponse, FileInfo, GlobResult

MAX_MATCHES = 5000
# Below deepagents' own tool deadline (GLOB_TIMEOUT, 10 s) so the walk reports a partial result
# instead of being abandoned.
WALK_BUDGET_SECONDS = 6.0
MAX_PATH_CHARS = 4096
_MAX_PATTERN_CHARS = 1024

# Runs as `python3 -c GUEST_SCRIPT root pattern limit budget` in the guest (Python 3.13).
GUEST_SCRIPT = r"""
import datetime, fnmatch, json, os, re, sys, time
root, pattern, limit, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
def expand(p):
    done, todo = [], [p]
    while todo:
        cur = todo.pop()
        m = re.search(r"\{([^{}]*,[^{}]*)\}", cur)
        if m is None:
            done.append(cur)
            continue
        todo.extend(cur[:m.start()] + alt + cur[m.end():] for alt in m.group(1).split(","))
        if len(done) + len(todo) > 64:
            out({"error": "too many {a,b} alternatives in the pattern (64 at most)"}); sys.exit(0)
    return done
def segments(p):
    if p.startswith("/"):
        segs = [s for s in p.split("/") if s]
    elif "/" not in p:
        segs = ["**", p]
    else:
        segs = [s for s in p.split("/") if s]
    collapsed = []
    for s in segs:
        if not (s == "**" and collapsed and collapsed[-1] == "**"):
            collapsed.append(s)
    return collapsed
def match(segs, parts):
    if not segs:
        return not parts
    head = segs[0]
    if head == "**":
        if match(segs[1:], parts):
            return True
        return bool(parts) and not parts[0].startswith(".") and match(segs, parts[1:])
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], head) and match(segs[1:], parts[1:])
if not os.path.isdir(root):
    out({"error": "not a directory: " + root}); sys.exit(0)
pats = [segments(p) for p in expand(pattern)]
pats = [s for s in pats if s and len(s) <= 64]
depth_cap = None if any("**" in s for s in pats) else max((len(s) for s in pats), default=0)
enter_dot = any(seg.startswith(".") and seg not in (".", "..") for s in pats for seg in s)
deadline = time.monotonic() + budget
found, reason, unreadable = [], None, []
for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable.append):
    if time.monotonic() > deadline or len(found) >= limit:
        reason = "budget"
        break
    rel = os.path.relpath(dirpath, root)
    parts = [] if rel == "." else rel.split(os.sep)
    for name in dirnames + filenames:
        entry = parts + [name]
        if any(match(s, entry) for s in pats):
            full = os.path.join(dirpath, name)
            info = {"path": "/".join(entry), "is_dir": name in dirnames}
            try:
                st = os.lstat(full)
                info["size"] = st.st_size
                info["modified_at"] = datetime.datetime.fromtimestamp(
                    st.st_mtime, datetime.timezone.utc).isoformat()
            except OSError:
                pass
            found.append(info)
    # Kernel views, not files: a walk from / would spend its budget there.
    skip = {"proc", "sys"} if os.path.abspath(dirpath) == "/" else set()
    dirnames[:] = sorted(d for d in dirnames if d not in skip
                         and (enter_dot or not d.startswith("."))
                         and (depth_cap is None or len(parts) + 1 < depth_cap))
if reason is None and len(found) > limit:
    reason = "budget"
if reason is None and unreadable:
    reason = "unreadable"
for info in sorted(found, key=lambda i: i["path"])[:limit]:
    out(info)
out({"done": reason})
"""


def glob_command(pattern: str, root: str) -> str | None:
    """The shell command for one glob, or None when the arguments cannot be passed on."""
    if not pattern or len(pattern) > _MAX_PATTERN_CHARS or "\x00" in pattern or "\x00" in root:
        return None
    argv = (root, pattern, str(MAX_MATCHES), str(WALK_BUDGET_SECONDS))
    args = " ".join(shlex.quote(a) for a in argv)
    return f"python3 -c {shlex.quote(GUEST_SCRIPT)} {args}"


def search_root(path: str | None) -> str:
    """Like deepagents' BaseSandbox: no path searches from /, a relative one is taken from /."""
    if not path:
        return "/"
    return path if path.startswith("/") else f"/{path}"


def parse_glob_output(result: ExecuteResponse) -> GlobResult:
    """Turn the guest script's JSON lines into a GlobResult; never raises."""
    matches: list[FileInfo] = []
    lines = result.output.splitlines()
    for index, line in enumerate(lines[: MAX_MATCHES + 2]):
        record = _load(line)
        if record is None:
            if result.truncated and index == len(lines) - 1:
                return GlobResult(matches=matches, truncated=True, truncation_reason="transport")
            return GlobResult(error=f"glob failed: {_snippet(result.output)}")
        if "error" in record:
            return GlobResult(error=f"glob failed: {_snippet(str(record['error']))}")
        if "done" in record:
            reason = record["done"] if record["done"] in ("budget", "unreadable") else None
            return GlobResult(
                matches=matches, truncated=reason is not None, truncation_reason=reason
            )
        info = _file_info(record)
        if info is None:
            return GlobResult(error=f"glob failed: malformed entry {_snippet(line)}")
        matches.append(info)
    if result.truncated:
        return GlobResult(matches=matches, truncated=True, truncation_reason="transport")
    return GlobResult(
        error=f"glob failed (exit code {result.exit_code}): {_snippet(result.output)}"
    )


def _load(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _file_info(record: dict[str, Any]) -> FileInfo | None:
    path, is_dir = record.get("path"), record.get("is_dir")
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH_CHARS or "\x00" in path:
        return None
    if not isinstance(is_dir, bool):
        return None
    info = FileInfo(path=path, is_dir=is_dir)
    size, modified = record.get("size"), record.get("modified_at")
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        info["size"] = size
    if isinstance(modified, str) and len(modified) <= 64:
        info["modified_at"] = modified
    return info


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= 300 else text[:300] + "..."
