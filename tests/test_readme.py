"""The README as a new user meets it (issue #21, item 9).

* The "First run" block is run as written, in order, by bash on a fresh copy of the repository
  (the files git tracks or would track, nothing built): scripts/bootstrap.sh, activating .venv,
  `invoke build --target host`, the tiny model and every text example on it, `colibri serve` and
  a chat request with curl. Only what bootstrap would download is prepared offline: the copy's
  .venv is a real virtual environment whose packages are this one's (a .pth file) with the copy's
  own colibri_kit first and bootstrap's install stamp, so bootstrap's pip step has nothing to do.
  As root the block runs in its own network namespace, so its port 8080 is its own.
* Every `invoke TASK --option` and `colibri COMMAND --option` in the README's shell blocks names
  a task, command and option that exist (the CLIs' own --help).
* The docs cite only files of the repository.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from colibri_kit.paths import project_root

README = project_root() / "README.md"


def sh_blocks(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every ```sh block, with the `## ` heading it sits under."""
    out, heading = [], ""
    for m in re.finditer(r"^(## [^\n]*)$|^```sh\n(.*?)^```$", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1)
        else:
            out.append((heading, m.group(2)))
    return out


def first_run_block() -> str:
    blocks = [body for heading, body in sh_blocks(README.read_text()) if heading.startswith("## First run")]
    assert len(blocks) == 1, "README.md needs one ```sh block under '## First run'"
    return blocks[0]


def commands(block: str) -> list[list[str]]:
    """Each command line of a block as argv (continuations joined, comments and `&` dropped)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv and argv[-1] == "&":
            argv = argv[:-1]
        if argv:
            out.append(argv)
    return out


def fresh_copy(dest: Path) -> Path:
    """The repository as a clone has it: tracked and untracked-but-not-ignored files."""
    root = project_root()
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=root, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = root / name
        if not os.path.lexists(src) or name == ".venv":
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        elif src.is_file():
            shutil.copy2(src, target)
    return dest


def offline_venv(copy: Path) -> None:
    """What bootstrap's `python -m venv` + `pip install -e .` leave, without the network."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(copy / ".venv")], check=True)
    py = copy / ".venv" / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]   # this environment's packages (invoke, fabric, ...)
    Path(purelib, "colibri-readme-test.pth").write_text(f"{copy}\n{ours}\n")
    (copy / ".venv/bin/invoke").write_text(
        f"#!{py}\nimport sys\nfrom invoke.main import program\nsys.exit(program.run())\n")
    (copy / ".venv/bin/invoke").chmod(0o755)
    (copy / ".venv/.colibri-installed").touch()   # bootstrap: "installed", newer than pyproject.toml


def test_the_first_run_block_works_on_a_fresh_copy(tmp_path):
    copy = fresh_copy(tmp_path / "clone")
    assert not (copy / "dist").exists() and (copy / "scripts/bootstrap.sh").is_file()
    offline_venv(copy)
    checks = ('\necho\necho "COLIBRI_ON_PATH=$(command -v colibri)"\n'
              'echo "INVOKE_ON_PATH=$(command -v invoke)"\n')
    script = "set -euo pipefail\n" + first_run_block() + checks
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "COLIBRI_PROJECT_ROOT")}
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if os.geteuid() == 0:   # a network namespace of its own: port 8080 is free there
        argv = ["unshare", "--net", "--", "bash", "-c", 'ip link set lo up && exec bash -c "$0"', script]
    else:
        argv = ["bash", "-c", script.replace("8080", str(_free_port()))]
    proc = subprocess.run(argv, cwd=copy, env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert f"COLIBRI_ON_PATH={copy}/.venv/bin/colibri" in out, out[-2000:]
    assert f"INVOKE_ON_PATH={copy}/.venv/bin/invoke" in out
    assert (copy / "dist/host/bin/colibri").is_file() and (copy / "tiny.colibri").is_file()
    assert '{"ids": [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]}' in out
    assert "\nHello" in "\n" + out
    docs = [json.JSONDecoder().raw_decode(line)[0] for line in out.splitlines() if line.startswith("{")]
    gen = [d for d in docs if "finish_reason" in d and "new_tokens" in d]
    assert gen and gen[0]["new_tokens"] == 16, docs
    chat = [d for d in docs if d.get("object") == "chat.completion"]
    assert chat and chat[0]["choices"][0]["message"]["role"] == "assistant", out[-2000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_command_in_the_readme_names_real_options(host_colibri):
    helps: dict[tuple[str, str], str] = {}

    def help_of(tool: str, sub: str) -> str:
        if (tool, sub) not in helps:
            if tool == "invoke":
                argv = [sys.executable, "-m", "invoke", "--help", sub]
            else:
                argv = [str(host_colibri), sub, "--help"]
            res = subprocess.run(argv, cwd=project_root(), capture_output=True, text=True, timeout=120)
            text = res.stdout + res.stderr
            if tool == "colibri":
                top = subprocess.run([str(host_colibri), "--help"], capture_output=True, text=True)
                text += top.stdout + top.stderr
                assert re.search(rf"^\s+{re.escape(sub)}\b", top.stdout + top.stderr, re.M), \
                    f"colibri has no command {sub!r}"
            else:
                assert res.returncode == 0, f"invoke has no task {sub!r}: {text[-500:]}"
            helps[tool, sub] = text
        return helps[tool, sub]

    seen = 0
    for heading, block in sh_blocks(README.read_text()):
        for argv in commands(block):
            tool = Path(argv[0]).name
            if tool not in ("invoke", "colibri") or len(argv) < 2 or argv[1].startswith("-"):
                continue
            text = help_of(tool, argv[1])
            for arg in argv[2:]:
                if arg.startswith("--"):
                    flag = arg.split("=", 1)[0]
                    # invoke spells options with dashes (--hf-dir for hf_dir)
                    assert re.search(rf"(^|[\s\[(|]){re.escape(flag)}\b", text, re.M), \
                        f"README ({heading}): {' '.join(argv)}: {tool} {argv[1]} has no {flag}"
            seen += 1
    assert seen >= 15


def test_the_docs_cite_only_files_of_the_repository():
    """DESIGN.md and FACTS.md are the project's working notes outside the repository."""
    root = project_root()
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = doc.read_text()
        for name in ("DESIGN.md", "FACTS.md"):
            assert name not in text, f"{doc.relative_to(root)} cites {name}, which is not in the repository"
        for ref in re.findall(r"\bdocs/[A-Za-z0-9_-]+\.md\b", text):
            assert (root / ref).is_file(), f"{doc.relative_to(root)} cites {ref}, which does not exist"
