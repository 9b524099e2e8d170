"""The worker's configuration: a TOML file decoded into `WorkerConfig`
(docs/reference/configuration.md).

Unknown keys are errors, so a typo never silently falls back to a default. A file without a
`[kinds]` table (or no file at all) gets the built-in kinds `train` and `embed`.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from typing import Any

import msgspec

from coordd import conffile
from coordd.paths import default_state_dir
from coordd.rules import ranges
from coordd.rules.resources import Request
from coordd.transport import REFUSED_BACKOFF_CAP_S

LEASE_S_DEFAULT = 30.0
HEARTBEAT_INTERVAL_S_DEFAULT = 5.0
GRACE_S_DEFAULT = 10.0
STOP_TIMEOUT_S_DEFAULT = 30.0
"""Must stay below the unit's TimeoutStopSec (60 s in coord-worker@.service)."""
CLAIM_INTERVAL_S_DEFAULT = 1.0
CLAIM_WAIT_S_DEFAULT = 30.0  # a parked claim / control watch is asked again this often
CLAIM_WAIT_S_MAX = 300.0  # coordd's default park_wait_max_s
INLINE_RESULT_BYTES_DEFAULT = 65536
TIMEOUT_S_DEFAULT = 3600.0
SLOTS_DEFAULT = 1
MAX_RESULT_BYTES_DEFAULT = 1 << 20

PLACEHOLDERS = ("job_id", "payload", "result", "checkpoint_dir", "resume_from", "usage")
"""The argv tokens replaced per job; each is also in the environment as COORD_<NAME>.
`usage`: a file the model may write, a JSON object of usage numbers (`{"tokens": 1234}`),
sent with `complete` for coordd's limit budgets."""
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r"|python)\}")


def default_work_dir() -> str:
    """`$STATE_DIRECTORY/work` when systemd gave the unit a state directory (the first, if
    several: a system user without a home still has a work_dir), else `work` in coordd's
    state folder (`$XDG_STATE_HOME/coordd/work`, ~/.local/state/coordd/work by default)."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(state, "work") if state else str(default_state_dir() / "work")


KIND_RANGES: dict[str, ranges.Range] = {
    "timeout_s": ranges.POSITIVE_S, "slots": ranges.AT_LEAST_ONE,
    "max_result_bytes": ranges.NON_NEGATIVE,
}
"""The range of every numeric key of a `[kinds.*]` table (coordd.rules.ranges.check)."""
RANGES: dict[str, ranges.Range] = {
    "lease_s": ranges.POSITIVE_S, "heartbeat_interval_s": ranges.POSITIVE_S,
    "grace_s": ranges.NON_NEGATIVE_S, "stop_timeout_s": ranges.POSITIVE_S,
    "claim_interval_s": ranges.POSITIVE_S, "inline_result_bytes": ranges.NON_NEGATIVE,
    "claim_wait_s": ranges.Range(0, CLAIM_WAIT_S_MAX), "connect_timeout_s": ranges.POSITIVE_S,
    "refused_backoff_cap_s": ranges.POSITIVE_S,
}
"""The range of every numeric top-level key of the worker's config."""


class WorkerConfigError(Exception):
    """The worker configuration file is missing, not TOML, or has bad values."""


class KindConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How to run one job kind.

    Attributes:
        argv: the command; `{job_id}`, `{payload}`, `{result}`, `{checkpoint_dir}` and
            `{resume_from}` are replaced (other braces are left as they are).
        timeout_s: run time after which the tree is stopped and the job failed (retryable).
        slots: how many jobs of this kind run at once on this worker.
        max_result_bytes: a larger result file fails the job (permanent).
        result_json: the result file must be JSON (else it is stored as an opaque artifact).
        env: extra environment variables for the model process.
        resources: what a job of this kind asks for when it names nothing itself
            (`{gpus, vram_mb, ram_mb}`, coordd.rules.resources), sent to coordd in the heartbeat.
    """

    argv: list[str]
    timeout_s: float = TIMEOUT_S_DEFAULT
    slots: int = SLOTS_DEFAULT
    max_result_bytes: int = MAX_RESULT_BYTES_DEFAULT
    result_json: bool = True
    env: dict[str, str] = {}
    resources: Request | None = None

    def check(self, prefix: str = "") -> None:
        """Raise ValueError (`<prefix><key> ...`) if a value is bad; WorkerConfig calls it
        with the table's name (msgspec's error path does not name a dict's key)."""
        if not self.argv or not self.argv[0]:
            raise ValueError(f"{prefix}argv must name a program")
        ranges.check(self, KIND_RANGES, prefix)


def default_kinds() -> dict[str, KindConfig]:
    """Return the built-in kinds: the repository's `train` and `embed` model processes."""
    py = sys.executable or "python3"
    return {
        "train": KindConfig(argv=[
            py, "-m", "worker.models.train", "--payload", "{payload}", "--result", "{result}",
            "--checkpoint-dir", "{checkpoint_dir}", "--resume-from", "{resume_from}"]),
        "embed": KindConfig(argv=[
            py, "-m", "worker.models.embed", "--payload", "{payload}", "--result", "{result}"]),
    }


RESOURCE_RANGES: dict[str, ranges.Range] = {
    "gpus": ranges.Range(0, 64), "gpu_memory_mb": ranges.AT_LEAST_ONE,
    "ram_mb": ranges.AT_LEAST_ONE,
}


class ResourcesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What this worker offers jobs where the probes cannot tell (None: as measured).

    Attributes:
        gpus: GPUs to advertise: fewer than NVML sees hides the rest; more (a machine NVML
            cannot see) adds GPUs of `gpu_memory_mb` MiB without a live reading; 0: none.
        gpu_memory_mb: MiB of each GPU that NVML does not see.
        ram_mb: MiB of RAM jobs may ask for (default: the machine's total).
    """

    gpus: int | None = None
    gpu_memory_mb: int | None = None
    ram_mb: int | None = None

    def __post_init__(self) -> None:
        ranges.check(self, RESOURCE_RANGES, "resources.")


class WorkerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The coord-worker settings (durations in seconds, sizes in bytes).

    Attributes:
        lease_s: lease asked for on claim; renewed every third of it.
        heartbeat_interval_s: how often readings are sent (keep well below coordd's
            `heartbeat_stale_s`).
        work_dir: per-job folders live here (`~` is expanded); not set: `default_work_dir()`.
        grace_s: SIGTERM -> SIGKILL grace for a model tree.
        stop_timeout_s: the worker exits within this after SIGTERM; keep it below systemd's
            TimeoutStopSec.
        claim_interval_s: idle poll interval when coordd has nothing for this worker and
            cannot park the claim (an older coordd), or the control watch is not served.
        claim_wait_s: how long an idle claim waits parked at coordd for a job (long poll)
            and the control watch for a cancel or governance action (0 = poll instead).
        inline_result_bytes: larger results go to the artifact store, not the DB.
        kinds: one table per job kind this worker can run.
        resources: overrides of the GPUs and RAM this worker advertises.
        socket: coordd's Unix socket ("" = `$COORDD_SOCKET` / the default), or a list
            of them (an active coordd and its standbys, tried in turn); `--socket` wins.
        connect: coordd's address: a socket path, or `tls://HOST:PORT` for a coordd on
            another host ("" = `socket`); a list for an active coordd and its standbys;
            `--connect` wins.
        tls_cert: this worker's certificate (PEM file) for `tls://`, as `coordctl ca
            issue` or `coord-worker enroll` wrote it; `--cert` wins.
        tls_key: the private key (PEM file) of tls_cert; `--key` wins.
        tls_ca: the fleet CA (PEM file) coordd's certificate must chain to; `--ca` wins.
        connect_timeout_s: one connect (TCP + TLS handshake) must finish within this.
        refused_backoff_cap_s: after coordd refused this worker (its certificate, the
            deny-list) it dials again after 1 s, then twice as long each time, up to this.
    """

    lease_s: float = LEASE_S_DEFAULT
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S_DEFAULT
    work_dir: str | None = None  # None (not in the file): default_work_dir()
    grace_s: float = GRACE_S_DEFAULT
    stop_timeout_s: float = STOP_TIMEOUT_S_DEFAULT
    claim_interval_s: float = CLAIM_INTERVAL_S_DEFAULT
    claim_wait_s: float = CLAIM_WAIT_S_DEFAULT
    inline_result_bytes: int = INLINE_RESULT_BYTES_DEFAULT
    kinds: dict[str, KindConfig] = msgspec.field(default_factory=default_kinds)
    resources: ResourcesConfig = msgspec.field(default_factory=ResourcesConfig)
    socket: str | list[str] = ""
    connect: str | list[str] = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    connect_timeout_s: float = 5.0
    refused_backoff_cap_s: float = REFUSED_BACKOFF_CAP_S

    def __post_init__(self) -> None:
        ranges.check(self, RANGES)
        if self.stop_timeout_s <= self.grace_s:
            raise ValueError("stop_timeout_s must be greater than grace_s")
        if self.work_dir is None:
            self.work_dir = default_work_dir()
        if not self.work_dir:
            raise ValueError("work_dir must not be empty")
        self.work_dir = os.path.abspath(os.path.expanduser(self.work_dir))
        if not self.kinds:
            raise ValueError("kinds must name at least one kind (or be left out for the built-ins)")
        for name, kind in self.kinds.items():
            if not name or name != name.strip():
                raise ValueError(f"bad kind name {name!r}")
            kind.check(f"kinds.{name}.")
        res = self.resources
        if res.gpus and res.gpu_memory_mb is None:
            raise ValueError("resources.gpu_memory_mb is needed with resources.gpus (the MiB of "
                             "each GPU NVML does not see)")

    @property
    def stop_margin_s(self) -> float:
        """How long before its local deadline an unrenewed lease's tree is stopped: the
        SIGTERM grace plus 0.1 % clock-rate drift (FLEET.md A5), at most a quarter lease."""
        return min(self.grace_s + self.lease_s * 0.001, self.lease_s / 4)

    @property
    def total_slots(self) -> int:
        """Jobs this worker runs at once, over all kinds."""
        return sum(k.slots for k in self.kinds.values())


def parse(text: str, source: str = "<config>") -> WorkerConfig:
    """Decode TOML text into a WorkerConfig.

    Raises:
        WorkerConfigError: not TOML, an unknown key, a wrong type or a bad value.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkerConfigError(f"{source}: not valid TOML: {exc}") from exc
    return from_dict(data, source)


def from_dict(data: dict[str, Any], source: str = "<config>") -> WorkerConfig:
    """Validate a decoded mapping as a WorkerConfig. Raises: WorkerConfigError."""
    try:
        return msgspec.convert(data, WorkerConfig)
    except msgspec.ValidationError as exc:
        raise WorkerConfigError(f"{source}: {conffile.locate(str(exc), data)}") from exc


def load(path: str | os.PathLike[str] | None) -> WorkerConfig:
    """Load the config file at `path`; None gives the defaults with the built-in kinds.

    Raises:
        WorkerConfigError: the file is unreadable (coordd.conffile) or invalid.
    """
    if path is None:
        return WorkerConfig()
    try:
        text = conffile.read(path)
    except conffile.ConfigFileError as exc:
        raise WorkerConfigError(f"cannot read config {os.fspath(path)}: {exc}") from exc
    return parse(text, os.fspath(path))


def expand_argv(argv: list[str], values: dict[str, str]) -> list[str]:
    """Replace the placeholder tokens in each argument (one pass; unknown braces stay).

    `{python}` is the worker's own interpreter, so model modules run in its environment.

    Args:
        argv: the kind's argv template.
        values: a value for every name in PLACEHOLDERS.
    """
    values = {"python": sys.executable, **values}
    return [_PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], arg) for arg in argv]


def job_env(values: dict[str, str]) -> dict[str, str]:
    """Return the COORD_* variables for the placeholder `values`."""
    return {f"COORD_{name.upper()}": values[name] for name in PLACEHOLDERS}
