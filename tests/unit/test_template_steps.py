"""Template build steps (Run, Copy, Env, Workdir, User) are validated when made, and the
Sandboxfile parser turns Dockerfile syntax into them, naming the line of anything it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

import exec_sandbox as sbx
from exec_sandbox import Copy, Env, InputValidationError, Run, User, Workdir
from exec_sandbox.errors import EnvVarValidationError
from exec_sandbox.templates.steps import STEPS_MAX, parse_sandboxfile, validate_steps


def test_steps_and_template_types_are_exported() -> None:
    for name in ("Run", "Copy", "Env", "Workdir", "User", "Template"):
        assert name in sbx.__all__ and hasattr(sbx, name)
    assert issubclass(sbx.TemplateError, sbx.PermanentError)
    assert issubclass(sbx.TemplateBuildError, sbx.TemplateError)


def test_template_build_error_keeps_its_details_through_pickle() -> None:
    import pickle

    exc = sbx.TemplateBuildError("step 2 failed", step=2, output="no such file\n", exit_code=127)
    copy = pickle.loads(pickle.dumps(exc))
    assert (str(copy), copy.step, copy.output, copy.exit_code) == (
        "step 2 failed",
        2,
        "no such file\n",
        127,
    )


def test_run_keeps_its_command_and_user() -> None:
    step = Run("apk add curl", user="user")
    assert (step.command, step.user) == ("apk add curl", "user")
    assert step.plan() == {"op": "run", "cmd": "apk add curl", "user": "user"}
    assert Run("true").plan() == {"op": "run", "cmd": "true"}


@pytest.mark.parametrize("command", ["", "   ", "a\x00b", "x" * (64 * 1024 + 1)])
def test_run_refuses_an_empty_nul_or_huge_command(command: str) -> None:
    with pytest.raises(InputValidationError):
        Run(command)


def test_run_refuses_a_non_string_command() -> None:
    with pytest.raises(InputValidationError):
        Run(["ls"])  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "kept"), [("root", "root"), ("0", "root"), ("1000", "user")])
def test_user_names_are_normalised(given: str, kept: str) -> None:
    assert User(given).name == kept
    assert Run("true", user=given).user == kept


@pytest.mark.parametrize("name", ["nobody", "", "1001", "root "])
def test_user_refuses_other_users(name: str) -> None:
    with pytest.raises(InputValidationError, match="root"):
        User(name)


def test_copy_takes_an_existing_file_or_directory(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    step = Copy(tmp_path / "f.txt", "/opt/tools/")
    assert step.source == tmp_path / "f.txt"
    assert step.dest == "/opt/tools"
    assert step.plan() == {"op": "copy", "dest": "/opt/tools", "file": "f.txt", "into": True}
    assert Copy(str(tmp_path), "/srv").source == tmp_path


def test_copy_refuses_a_missing_source(tmp_path: Path) -> None:
    with pytest.raises(InputValidationError, match="existing file or directory"):
        Copy(tmp_path / "absent", "/opt")


@pytest.mark.parametrize("dest", ["relative/dir", "", "/a\x00b", "/a\nb"])
def test_copy_refuses_a_bad_destination(tmp_path: Path, dest: str) -> None:
    with pytest.raises(InputValidationError):
        Copy(tmp_path, dest)


def test_workdir_is_absolute_and_normalised() -> None:
    assert Workdir("/app/./src/../lib/").path == "/app/lib"
    with pytest.raises(InputValidationError, match="absolute"):
        Workdir("app")


def test_env_takes_keywords_or_a_mapping() -> None:
    assert Env(A="1", B="two").vars == {"A": "1", "B": "two"}
    assert Env({"PATH": "/opt/bin:/bin"}).vars == {"PATH": "/opt/bin:/bin"}
    assert Env({"A": "1"}, B="2").plan() == {"op": "env", "vars": {"A": "1", "B": "2"}}


@pytest.mark.parametrize(
    "variables",
    [{}, {"1A": "x"}, {"A-B": "x"}, {"A": "line\nbreak"}, {"A": "nul\x00"}, {"A": 1}],
)
def test_env_refuses_bad_names_and_values(variables: dict[str, object]) -> None:
    with pytest.raises(EnvVarValidationError):
        Env(variables)  # type: ignore[arg-type]


def test_steps_are_frozen() -> None:
    step = Run("true")
    with pytest.raises(AttributeError):
        step.command = "false"  # type: ignore[misc]


def test_validate_steps_refuses_a_foreign_object_and_too_many() -> None:
    assert validate_steps([Run("true"), User("user")]) == (Run("true"), User("user"))
    with pytest.raises(InputValidationError, match="step 1"):
        validate_steps([Run("true"), "RUN true"])
    with pytest.raises(InputValidationError, match="more than"):
        validate_steps([Run("true")] * (STEPS_MAX + 1))


# --- the Sandboxfile ---


def test_sandboxfile_every_directive(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "requirements.txt").write_text("x")
    text = """
# a comment
FROM python:3.12-slim
ENV LANG=C.UTF-8 GREETING="hello world"
ENV LEGACY the rest of the line
WORKDIR /srv
COPY requirements.txt /opt/
COPY app ./app
RUN pip install -r /opt/requirements.txt
RUN ["echo", "it's", "json"]
USER user
WORKDIR data
"""
    from_, steps = parse_sandboxfile(text, tmp_path)
    assert from_ == "python:3.12-slim"
    assert steps == [
        Env(LANG="C.UTF-8", GREETING="hello world"),
        Env(LEGACY="the rest of the line"),
        Workdir("/srv"),
        Copy(tmp_path / "requirements.txt", "/opt/"),
        Copy(tmp_path / "app", "/srv/app"),
        Run("pip install -r /opt/requirements.txt"),
        Run("echo 'it'\"'\"'s' json"),
        User("user"),
        Workdir("/srv/data"),
    ]


def test_sandboxfile_json_run_is_quoted_for_the_shell(tmp_path: Path) -> None:
    _, steps = parse_sandboxfile('RUN ["printf", "%s\\n", "a b", "$HOME"]', tmp_path)
    # JSON's \n is a newline, kept inside the quotes
    assert steps == [Run("printf '%s\n' 'a b' '$HOME'")]


def test_sandboxfile_without_from(tmp_path: Path) -> None:
    assert parse_sandboxfile("RUN true\n", tmp_path) == (None, [Run("true")])


def test_sandboxfile_line_continuations_join_lines(tmp_path: Path) -> None:
    text = (
        "RUN apt-get update && \\\n"
        "    # skipped inside a continuation\n"
        "    apt-get install -y curl\n"
        "USER root\n"
    )
    _, steps = parse_sandboxfile(text, tmp_path)
    assert steps == [Run("apt-get update && apt-get install -y curl"), User("root")]


def test_sandboxfile_directives_are_case_insensitive(tmp_path: Path) -> None:
    _, steps = parse_sandboxfile("run true\nworkdir /x\n", tmp_path)
    assert steps == [Run("true"), Workdir("/x")]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('RUN true\nCMD ["sh"]\n', 2, "CMD is not supported"),
        ("\n\nEXPOSE 80\n", 3, "EXPOSE is not supported"),
        ("RUN true\nFROM alpine\n", 2, "FROM must come once"),
        ("FROM a AS b\n", 1, "FROM takes one image"),
        ("COPY missing.txt /opt\n", 1, "does not exist"),
        ("COPY ../outside /opt\n", 1, "outside the build context"),
        ("COPY *.txt /opt\n", 1, "wildcards"),
        ("COPY --chown=1000 a /opt\n", 1, "options are not supported"),
        ("COPY onlyone\n", 1, "source and a destination"),
        ("RUN true\nCOPY . relative\n", 2, "no WORKDIR came before"),
        ("WORKDIR relative\n", 1, "no WORKDIR came before"),
        ("RUN []\n", 1, "runs nothing"),
        ('RUN ["a", 1]\n', 1, "JSON list of strings"),
        ("RUN [not json\n", 1, "JSON"),
        ("ENV\n", 1, "NAME=VALUE"),
        ("ENV A=1 B\n", 1, "not NAME=VALUE"),
        ("ENV 1BAD=x\n", 1, "invalid environment variable name"),
        ("USER nobody\n", 1, "root"),
        ("RUN --mount=type=cache true\n", 1, "options are not supported"),
        ("RUN true\nRUN echo \\\n", 2, "ends in a line continuation"),
    ],
)
def test_sandboxfile_errors_name_the_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "outside").write_text("x")
    with pytest.raises(InputValidationError, match=f"Sandboxfile line {line}: .*{words}"):
        parse_sandboxfile(text, tmp_path / "ctx")


def test_sandboxfile_copy_through_a_symlink_out_of_the_context_is_refused(
    tmp_path: Path,
) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    (tmp_path / "secret").write_text("x")
    (context / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(InputValidationError, match="line 1: .*outside the build context"):
        parse_sandboxfile("COPY link /opt\n", context)


def test_sandboxfile_copy_of_several_sources_makes_a_step_each(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_text(name)
    _, steps = parse_sandboxfile('COPY ["a", "b", "/opt/"]\n', tmp_path)
    assert steps == [Copy(tmp_path / "a", "/opt/"), Copy(tmp_path / "b", "/opt/")]
    assert all(step.into for step in steps)


def test_copy_of_a_file_goes_to_dest_or_into_it_as_a_dockerfiles_does(tmp_path: Path) -> None:
    (tmp_path / "hi.sh").write_text("echo hi")
    (tmp_path / "dir").mkdir()
    at = Copy(tmp_path / "hi.sh", "/usr/local/bin/hi")
    assert (at.dest, at.into) == ("/usr/local/bin/hi", False)
    assert at.plan() == {"op": "copy", "dest": "/usr/local/bin/hi", "file": "hi.sh", "into": False}
    into = Copy(tmp_path / "hi.sh", "/usr/local/bin/")
    assert into.plan()["into"] is True
    assert Copy(tmp_path / "dir", "/opt").plan() == {"op": "copy", "dest": "/opt"}
