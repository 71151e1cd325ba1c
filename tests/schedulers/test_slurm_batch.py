"""Slurm: the sbatch request (dry runs only; the real cluster is in test_slurm_scheduler)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path
from typing import List

import pytest

from torchx import specs
from torchx.components import utils
from torchx.runtime.progress import ENV_PROGRESS_FILE
from torchx.schedulers.api import (
    IDEMPOTENCY_TOKEN,
    OWNER,
    InvalidAppError,
    idempotency_token,
)
from torchx.schedulers.slurm.batch import (
    LOAD_ENV,
    SBATCH_GROUP_OPTIONS,
    SBATCH_JOB_OPTIONS,
    SlurmOpts,
    SlurmReplicaRequest,
    comment_metadata,
    token_of,
)
from torchx.schedulers.slurm.scheduler import create_scheduler
from torchx.schedulers.slurm.status import parse_sacct, parse_scontrol, parse_squeue_text


def _script(app: specs.AppDef, cfg: dict) -> str:
    return create_scheduler("torchx").submit_dryrun(app, cfg).request.materialize()


def test_dryrun_script_is_a_hetjob_with_rank0_host() -> None:
    app = utils.sh("echo", "$x", num_replicas=2, cpu=2, memMB=500)
    script = _script(app, {"partition": "debug", "time": "1:00"})
    assert script.count("#SBATCH --job-name=sh-") == 2 and "#SBATCH hetjob" in script
    assert "--partition=debug --time=1:00 --ntasks-per-node=1 --cpus-per-task=2 --mem=500" in (
        script
    )
    assert "--het-group=1" in script and "export TORCHX_RANK0_HOST=" in script
    assert '/slurm-"$SLURM_JOB_ID"-sh-1.out' in script  # in the job's directory
    assert "'echo '\"'\"'$x'\"'\"''" in script  # the user's $x is not expanded by the batch script


def _srun_words(script: str, cwd: Path) -> List[List[str]]:
    """The words real bash passes to ``srun`` for the script's srun line, per het group
    (``srun`` is a shell function here that prints them; ``SLURM_JOB_ID`` is 42)."""
    line = "srun " + script.split("\nsrun ", 1)[1].split("\nrc=$?")[0]
    printer = "srun() { printf '%s\\0' \"$@\"; }; SLURM_JOB_ID=42; "
    out = subprocess.run(
        ["bash", "-c", printer + line], cwd=cwd, capture_output=True, check=True
    ).stdout.decode("utf-8", "surrogateescape")
    groups: List[List[str]] = [[]]
    for word in out.split("\0")[:-1]:
        if word == ":":
            groups.append([])
        else:
            groups[-1].append(word)
    return groups


def _sourced(env_text: str, names: List[str], cwd: Path) -> List[str]:
    """The values real ``sh`` holds for ``names`` once it sourced ``env_text`` (as each
    replica's ``srun`` component does; ``SLURM_JOB_ID`` is 42)."""
    env_file = cwd / "sourced.env"
    env_file.write_bytes(env_text.encode("utf-8", "surrogateescape"))
    printer = 'SLURM_JOB_ID=42; . "$0" && printf "%s\\0" ' + " ".join(f'"${n}"' for n in names)
    out = subprocess.run(["sh", "-c", printer, str(env_file)], cwd=cwd, capture_output=True)
    env_file.unlink()
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


def test_every_user_token_reaches_the_command_as_one_word(tmp_path: Path) -> None:
    args = ["$(touch X)", "`touch Y`", "a b", "", "it's", "${app_id}", "$SLURM_JOB_ID", ";|&"]
    app = utils.sh("true", entrypoint="printf", num_replicas=2)
    app.roles[0].args = ["%s\\n", *args]
    app.roles[0].env = {"V": "$(touch Z) 'q' \"d\"", "EMPTY": "", "J": "x-${app_id}"}
    req = create_scheduler("torchx").submit_dryrun(app, {"job_dir": str(tmp_path / "j")}).request
    groups = _srun_words(req.materialize(), tmp_path)
    assert len(groups) == 2
    for i, words in enumerate(groups):
        assert words[:8] == [
            f"--het-group={i}",
            f"--output={tmp_path}/j/slurm-42-sh-{i}.out",
            f"--error={tmp_path}/j/slurm-42-sh-{i}.err",
            "--kill-on-bad-exit=1",
            *["sh", "-c", LOAD_ENV, req.env_file(f"sh-{i}")],  # the env: from the file
        ]
        # ${app_id} (torchx's macro) is the job id; a user's literal $SLURM_JOB_ID stays literal
        assert words[-len(args) :] == [*args[:5], "42", "$SLURM_JOB_ID", ";|&"]
        env_text = req.replicas[f"sh-{i}"].env_text()
        want = ["$(touch Z) 'q' \"d\"", "", "x-42"]
        assert _sourced(env_text, ["V", "EMPTY", "J"], tmp_path) == want
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


# secrets a team's env holds: by name, by MLflow's credential variable, in a URL's userinfo
SECRET = "hf_" + "s3cr3tHuggingFaceValue"
PASSWORD = "mlflow-Pa55word-value"
URL_PASSWORD = "urlPa55word99"
SECRET_ENV = {
    "HF_TOKEN": SECRET,
    "MLFLOW_TRACKING_PASSWORD": PASSWORD,
    "MLFLOW_TRACKING_URI": f"http://u:{URL_PASSWORD}@h:5000",
}


def _two_role_app() -> specs.AppDef:
    """A heterogeneous job: two roles with the secrets, and one name set apart per role."""
    roles = []
    for name, own in (("trainer", "t"), ("reader", "r\n'\"$(touch X)\udcff")):
        role = utils.sh("true", num_replicas=2, env={**SECRET_ENV, "OWN": own}).roles[0]
        role.name = name
        roles.append(role)
    return specs.AppDef("het", roles)


def test_no_secret_value_in_the_script_the_commands_or_the_dry_run(tmp_path: Path) -> None:
    info = create_scheduler("torchx").submit_dryrun(_two_role_app(), {})
    req = info.request
    shown = {
        "script": req.materialize(),
        "sbatch": " ".join(req.cmd),
        "srun": "\0".join(w for g in _srun_words(req.materialize(), tmp_path) for w in g),
        "dry run": str(info),
    }
    for where, text in shown.items():
        for value in (SECRET, PASSWORD, URL_PASSWORD):
            assert value not in text, (where, value)
    # the dry run still shows every name, and what is not secret
    assert str(info).count("export HF_TOKEN='***'") == 4
    assert str(info).count("export MLFLOW_TRACKING_URI='http://u:***@h:5000'") == 4
    assert "export OWN=t" in str(info)


def test_each_replica_gets_its_own_env_from_a_new_private_file(tmp_path: Path) -> None:
    app = _two_role_app()
    req = create_scheduler("torchx").submit_dryrun(app, {"job_dir": str(tmp_path / "j")}).request
    script = Path(req.write())
    assert script.parent == tmp_path / "j" and script.read_text() == req.materialize()
    names = [*SECRET_ENV, "OWN", "TORCHX_REPLICA_ID"]
    for role in app.roles:
        for i in range(2):
            env_file = Path(req.env_file(f"{role.name}-{i}"))
            assert env_file.parent == tmp_path / "j"
            assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
            text = env_file.read_bytes().decode("utf-8", "surrogateescape")
            assert _sourced(text, names, tmp_path) == [
                *SECRET_ENV.values(),
                role.env["OWN"],
                str(i),
            ]
    assert stat.S_IMODE(script.stat().st_mode) == 0o600
    assert not (tmp_path / "X").exists()
    # never replaced, never written through a planted symlink
    with pytest.raises(FileExistsError):
        req.write()
    other = create_scheduler("torchx").submit_dryrun(app, {"job_dir": str(tmp_path / "j")})
    target = tmp_path / "target"
    target.write_text("mine")
    Path(other.request.env_file("trainer-0")).symlink_to(target)
    with pytest.raises(FileExistsError):
        other.request.write()
    assert target.read_text() == "mine"


def test_an_env_value_with_a_nul_byte_is_refused() -> None:
    req = create_scheduler("torchx").submit_dryrun(utils.sh("true", env={"V": "a\0b"}), {})
    with pytest.raises(InvalidAppError, match="env var V of role 'sh-0' holds a NUL byte"):
        req.request.replicas["sh-0"].env_text()


def test_without_job_dir_nothing_lands_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job runs in the submitter's directory; its script, env files and logs live in
    a new directory under $TORCHX_HOME."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    req = create_scheduler("torchx").submit_dryrun(utils.sh("true", env=SECRET_ENV), {}).request
    job_dir = Path(str(req.job_dir))
    assert job_dir.parent == tmp_path / "home" / "slurm" / "jobs"
    assert f"--chdir={work}" in req.cmd and f"--output={job_dir}/slurm-%j.out" in req.cmd
    req.write()
    assert list(work.iterdir()) == []
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert f"--output={job_dir}/slurm-" in req.materialize()


@pytest.mark.parametrize("name", ["A$(touch X)B", "1A", "A-B", "A B", "", "A=B"])
def test_env_names_must_be_identifiers(name: str) -> None:
    app = utils.sh("true", env={name: "1"})
    with pytest.raises(InvalidAppError, match="env var name .* is not (allowed|valid)") as err:
        create_scheduler("torchx").submit_dryrun(app, {})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "cfg", [{"partition": "debug\nsrun touch X"}, {"time": "1:00 --wrap=x"}, {"qos": "a'b"}]
)
def test_sbatch_line_values_are_single_plain_tokens(cfg: dict) -> None:
    with pytest.raises(InvalidAppError, match="slurm option .* is not allowed"):
        create_scheduler("torchx").submit_dryrun(utils.sh("true"), cfg)


def test_idempotency_token_joins_the_users_comment() -> None:
    token = idempotency_token("dag/task/run")
    app = utils.sh("true")
    app.metadata[IDEMPOTENCY_TOKEN] = token
    sched = create_scheduler("torchx")
    cmd = sched.submit_dryrun(app, {"comment": "my note"}).request.cmd
    assert f"--comment=my note torchx-token={token}" in cmd
    assert token_of(f"my note torchx-token={token}") == token
    assert f"--comment=torchx-token={token}" in sched.submit_dryrun(app, {}).request.cmd
    plain = sched.submit_dryrun(utils.sh("true"), {}).request.cmd
    assert not any(c.startswith("--comment") for c in plain)
    assert token_of("my note") is None and token_of("(null)") is None


OWNER_DOC = '{"kind":"airflow","api":"http://af:8080","dag":"d","run":"manual 1 | 100%","try":1}'


def test_owner_rides_in_the_comment_before_the_token_as_one_word() -> None:
    token = idempotency_token("k")
    app = utils.sh("true")
    app.metadata.update({IDEMPOTENCY_TOKEN: token, OWNER: OWNER_DOC})
    cmd = create_scheduler("torchx").submit_dryrun(app, {"comment": "my note"}).request.cmd
    (comment,) = [c.split("=", 1)[1] for c in cmd if c.startswith("--comment=")]
    words = comment.split(" ")
    assert words[:2] == ["my", "note"] and words[3] == f"torchx-token={token}" and len(words) == 4
    assert "|" not in comment
    assert token_of(comment) == token  # the token stays last, where older readers look
    assert comment_metadata(comment) == {OWNER: OWNER_DOC, IDEMPOTENCY_TOKEN: token}
    # comments written before owners existed still read
    assert comment_metadata(f"my note torchx-token={token}") == {IDEMPOTENCY_TOKEN: token}
    assert comment_metadata("(null)") == {} and comment_metadata("") == {}


def test_every_status_source_carries_the_comment() -> None:
    comment = "note torchx-owner=%7B%22kind%22:%22kfp%22%7D torchx-token=tx1"
    want = {OWNER: '{"kind":"kfp"}', IDEMPOTENCY_TOKEN: "tx1"}
    squeue = f"7|7|0|RUNNING|0|node1|r-0|/w|{comment}\n"
    sacct = f"7|r-0|RUNNING|0:0|node1|/w|{comment}\n7.0|r-0|RUNNING|0:0|node1|/w|\n"
    scontrol = f"JobId=7 JobName=r-0 JobState=RUNNING WorkDir=/w Comment={comment}  StdErr=/w/e\n"
    for parts in (parse_squeue_text(squeue, "7"), parse_sacct(sacct, "7")):
        assert comment_metadata(parts[0]["comment"]) == want
    assert comment_metadata(parse_scontrol(scontrol, "7")[0]["comment"]) == want
    # output without the comment column (fields as before) still parses
    assert parse_squeue_text("7|7|0|RUNNING|0|node1|r-0|/w\n", "7")[0]["comment"] == ""


def test_a_comment_slurm_would_refuse_is_one_clear_error() -> None:
    app = utils.sh("true")
    app.metadata[OWNER] = '{"kind":"kfp","run":"' + "r" * 1100 + '"}'
    with pytest.raises(InvalidAppError, match=r"job comment would be \d+ characters .* 1024"):
        create_scheduler("torchx").submit_dryrun(app, {})


def test_each_replica_is_told_the_progress_file_in_the_job_dir(tmp_path: Path) -> None:
    app = utils.sh("true", num_replicas=2)
    req = create_scheduler("torchx").submit_dryrun(app, {"job_dir": str(tmp_path / "j")}).request
    want = f'export {ENV_PROGRESS_FILE}={tmp_path}/j/slurm-"$SLURM_JOB_ID".progress.json\n'
    assert all(want in r.env_text() for r in req.replicas.values()), req


def test_upstream_sbatch_option_sets_say_where_each_cfg_key_goes() -> None:
    assert {"comment", "mail-user", "mail-type"} <= SBATCH_JOB_OPTIONS
    assert {"partition", "time", "constraint"} <= SBATCH_GROUP_OPTIONS
    cfg: SlurmOpts = {
        "comment": "c",
        "mail-user": "u@example.com",
        "mail-type": "END",
        "partition": "debug",
        "time": "5",
        "constraint": "cpu",
        "account": "research",
        "qos": "normal",
        "exclusive": True,
    }
    req = create_scheduler("torchx").submit_dryrun(utils.sh("true", num_replicas=2), cfg).request
    for key in SBATCH_JOB_OPTIONS:  # once, on the command line
        assert sum(c.startswith(f"--{key}=") for c in req.cmd) == 1
    groups = [g for g in req.materialize().splitlines() if g.startswith("#SBATCH --job-name")]
    for key in SBATCH_GROUP_OPTIONS:  # on every het group
        flag = f"--{key}" if key == "exclusive" else f"--{key}={cfg[key]}"  # type: ignore
        assert len(groups) == 2 and all(flag in g.split() for g in groups), (key, groups)


def test_replica_request_from_role_and_materialize_as_upstream() -> None:
    role = specs.Role(
        "trainer",
        image="/img",
        entrypoint="python",
        args=["-c", "print('${app_id}')"],
        env={"K": "v v"},
        resource=specs.Resource(cpu=2, gpu=1, memMB=2048),
    )
    req = SlurmReplicaRequest.from_role("trainer-0", role, {"partition": "p", "comment": "c"})
    assert (req.name, req.entrypoint, req.args, req.env) == (
        "trainer-0",
        "python",
        ["-c", "print('${app_id}')"],
        {"K": "v v"},
    )
    assert req.sbatch_opts["partition"] == "p" and "comment" not in req.sbatch_opts
    sbatch, srun = req.materialize()
    assert sbatch[0] == "--job-name=trainer-0"
    assert {"--cpus-per-task=2", "--mem=2048", "--gpus-per-task=1", "--requeue"} <= set(sbatch)
    assert srun[-3:] == ["python", "-c", "'print('\"'\"''\"$SLURM_JOB_ID\"''\"'\"')'"]
    assert '--output=slurm-"$SLURM_JOB_ID"-trainer-0.out' in srun
    assert "v v" not in " ".join(srun) and req.env_text() == "export K='v v'\n"
    nomem, _ = SlurmReplicaRequest.from_role("trainer-0", role, {}, nomem=True).materialize()
    assert not any(o.startswith("--mem") for o in nomem)
