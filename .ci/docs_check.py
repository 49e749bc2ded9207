#!/usr/bin/env python3
"""The manual against the code (CI, after the build): README.md and docs/*.md.

1. README.md is a front page: at most 300 lines.
2. Every relative link names a file that exists.
3. Every command in a shell block that runs ipool's binaries (`ipoolctl`, `ipoold`, `ipool`
   the plugin, `ipool-bench`, `cargo run --bin X -- ...`) names subcommands and flags the
   binary has (its --help, as built); `cargo test --test T` names a test that exists;
   `kubectl apply -k/-f PATH` and scripts under deploy/ name files that exist.
4. Every `ipoolctl` command a table row of docs/operations.md lists names subcommands and
   flags that exist.
5. Every TOML block parses.

The worked example of the README is run, command by command, by server/tests/node/docs.rs.

Usage: python3 .ci/docs_check.py target/debug
"""
import glob
import os
import re
import shlex
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import check  # noqa: E402  deploy/check.py: --help parsing, shared

failures = []


def fail(where, msg):
    failures.append(f"{where}: {msg}")


def pages():
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def blocks(text):
    """(language, first line number, lines) of each fenced block."""
    out, lang, start, body = [], None, 0, []
    for i, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^```(\w*)", line)
        if m and lang is None:
            lang, start, body = m.group(1) or "plain", i + 1, []
        elif line.startswith("```") and lang is not None:
            if line.strip() != "```":
                fail(f"line {i}", f"a code block's closing fence with text after it: {line!r}")
            out.append((lang, start, body))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


def commands(lines):
    """Each command of a shell block, continuation lines joined, as (line number offset,
    argv), split at pipes and &&; heredoc bodies and placeholders ([--x]) skipped."""
    joined, start, heredoc = "", 0, None
    for i, line in enumerate(lines):
        if heredoc:
            if line.strip() == heredoc:
                heredoc = None
            continue
        if not joined:
            start = i
        joined += line.rstrip("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        m = re.search(r"<<'?(\w+)'?", joined)
        if m:
            heredoc = m.group(1)
        text, joined = joined, ""
        # [--flag value] is the manual's notation for an optional part: keep its words.
        text = text.replace("[", " ").replace("]", " ")
        try:
            words = shlex.split(text, comments=True)
        except ValueError:
            continue
        seg = []
        for w in words + ["&&"]:
            if w in ("&&", "|", ";", "||"):
                if seg:
                    yield start, seg
                seg = []
            else:
                seg.append(w)


def valued(help_text, flag):
    """Whether `flag` takes a value, as the help shows it (`--socket <SOCKET>`)."""
    long = rf"^\s+(?:-[A-Za-z], )?{re.escape(flag)}[ =]<"
    short = rf"^\s+{re.escape(flag)}, --[a-z0-9-]+[ =]<"
    return any(re.search(p, help_text, re.M) for p in (long, short))


def check_binary(where, binary, args):
    """`binary args...`: each subcommand and flag exists (--help of the path so far)."""
    path = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a.startswith("-"):
            # `--flag value`: its value is no subcommand.
            helps = [check.help_of(binary, *path[:k]) for k in range(len(path) + 1)]
            skip = "=" not in a and any(valued(h, a) for h in helps)
            continue
        subcommands = check.subcommands_in(check.help_of(binary, *path))
        if a in subcommands:
            path.append(a)
            continue
        # A word where the binary expects a subcommand: one it lacks (a positional
        # argument is only where there are no subcommands).
        if subcommands and not re.match(r"^[A-Z]", a):
            fail(where, f"{os.path.basename(binary)} {' '.join(path)} has no subcommand {a}")
        break
    known = check.flags_in(check.help_of(binary, *path)) | {"--help", "--version"}
    # Global flags of each level above.
    for k in range(len(path)):
        known |= check.flags_in(check.help_of(binary, *path[:k]))
    for f in check.flag_names(args) - known:
        fail(where, f"{os.path.basename(binary)} {' '.join(path)} has no flag {f}")


def check_command(where, argv, bindir):
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        argv = argv[1:]
    if argv[:1] in (["sudo"], ["export"]):
        return
    if not argv:
        return
    name = os.path.basename(argv[0])
    if name in ("ipoolctl", "ipoold", "ipool-bench"):
        check_binary(where, os.path.join(bindir, name), argv[1:])
    elif argv[0] == "kubectl" and "exec" in argv and "--" in argv:
        inner = argv[argv.index("--") + 1:]
        check_command(where, inner, bindir)
    elif argv[0] == "kubectl" and argv[1:2] == ["apply"]:
        for flag in ("-k", "-f"):
            p = check.flag_value(argv, flag)
            if p and not p.startswith("http") and not os.path.exists(os.path.join(ROOT, p)):
                fail(where, f"kubectl apply {flag} {p}: no such file")
    elif argv[0] == "cargo" and argv[1:2] == ["run"] and "--bin" in argv:
        binary = argv[argv.index("--bin") + 1]
        rest = argv[argv.index("--") + 1:] if "--" in argv else []
        if not os.path.exists(os.path.join(bindir, binary)):
            fail(where, f"cargo run --bin {binary}: no such binary in {bindir}")
        else:
            check_binary(where, os.path.join(bindir, binary), rest)
    elif argv[0] == "cargo" and argv[1:2] == ["test"] and "--test" in argv:
        test = argv[argv.index("--test") + 1]
        if not (glob.glob(os.path.join(ROOT, "*", "tests", f"{test}.rs"))
                or glob.glob(os.path.join(ROOT, "*", "tests", test, "main.rs"))):
            fail(where, f"cargo test --test {test}: no such test file")
    elif argv[0].startswith("deploy/") or argv[0].startswith(".ci/"):
        if not os.path.exists(os.path.join(ROOT, argv[0])):
            fail(where, f"{argv[0]}: no such script")


def check_links(page, text):
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), path)):
            fail(page, f"link to {target}: no such file")


def check_table_commands(page, text, bindir):
    """Rows of docs/operations.md's tables whose first cell is an ipoolctl command."""
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\| `([a-z][a-z -]*[a-z])( [^`]*)?`", line)
        if not m or not line.startswith("| `"):
            continue
        for cell in re.findall(r"`([^`]+)`", line.split("|")[1]):
            words = cell.replace("[", " ").replace("]", " ").replace("\\|", " ").split()
            if words and words[0] in check.subcommands_in(check.help_of(os.path.join(bindir, "ipoolctl"))):
                check_binary(f"{page}:{n}", os.path.join(bindir, "ipoolctl"), words)


def main():
    bindir = sys.argv[1] if len(sys.argv) > 1 else "target/debug"
    bindir = os.path.join(ROOT, bindir) if not os.path.isabs(bindir) else bindir
    readme = open(os.path.join(ROOT, "README.md")).read()
    lines = readme.count("\n")
    if lines > 300:
        fail("README.md", f"{lines} lines: the front page is at most 300 (move reference to docs/)")
    for page in pages():
        text = open(os.path.join(ROOT, page)).read()
        check_links(page, text)
        for lang, start, body in blocks(text):
            if lang in ("sh", "bash", "console", "shell"):
                for off, argv in commands(body):
                    check_command(f"{page}:{start + off}", argv, bindir)
            elif lang == "toml":
                try:
                    tomllib.loads("\n".join(body))
                except tomllib.TOMLDecodeError as e:
                    fail(f"{page}:{start}", f"the TOML block does not parse: {e}")
        if page == "docs/operations.md":
            check_table_commands(page, text, bindir)
    for f in failures + check.failures:
        print("FAIL:", f)
    print(f"docs_check: {len(failures) + len(check.failures)} failure(s)")
    sys.exit(1 if failures or check.failures else 0)


main()
