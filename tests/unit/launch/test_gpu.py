"""The GPU side of the managed target that can be checked without a GPU:
replicas sharing one GPU, the built-in 1B model's shape, dtype and identity."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sessiongen.errors import ScenarioError
from sessiongen.launch import commands, tinymodel
from sessiongen.scenario.spec import ManagedSpec


def gpu_spec(**changes: object) -> ManagedSpec:
    fields: dict[str, object] = {"device": "cuda", "replicas": 2, "model": "builtin:llama-1b"}
    fields.update(changes)
    return ManagedSpec(**fields)


def visible(spec: ManagedSpec, replica: int, listed: str) -> str:
    env = commands.env_overrides(spec, replica, base_env={"CUDA_VISIBLE_DEVICES": listed})
    return env["CUDA_VISIBLE_DEVICES"]


def test_two_replicas_share_one_gpu_when_their_memory_fits() -> None:
    spec = gpu_spec(vllm_args=("--gpu-memory-utilization", "0.3"))
    assert [visible(spec, i, "0") for i in range(2)] == ["0", "0"]
    eq_form = gpu_spec(vllm_args=("--gpu-memory-utilization=0.5",))
    assert [visible(eq_form, i, "3") for i in range(2)] == ["3", "3"]
    three = gpu_spec(replicas=3, vllm_args=("--gpu-memory-utilization", "0.45"))
    assert [visible(three, i, "0,1") for i in range(3)] == ["0", "1", "0"]


@pytest.mark.parametrize(
    "args",
    [(), ("--gpu-memory-utilization", "0.6"), ("--gpu-memory-utilization", "lots")],
    ids=["default-0.9", "too-much", "not-a-number"],
)
def test_sharing_refused_when_the_replicas_do_not_fit(args: tuple[str, ...]) -> None:
    with pytest.raises(ScenarioError, match="gpu-memory-utilization"):
        visible(gpu_spec(vllm_args=args), 1, "0")


def test_enough_gpus_are_never_shared() -> None:
    spec = gpu_spec(vllm_args=("--gpu-memory-utilization", "0.3"))
    assert [visible(spec, i, "4,5") for i in range(2)] == ["4", "5"]


def test_llama_1b_shape_and_kv_size() -> None:
    recipe = tinymodel.RECIPES["builtin:llama-1b"]
    params = sum(math.prod(shape) for shape in tinymodel.weight_shapes(recipe).values())
    assert 0.5e9 < params < 1.0e9  # the asked-for 0.5-1B
    assert recipe.config["max_position_embeddings"] >= 131072
    c = recipe.config
    expected = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2
    assert tinymodel.kv_bytes_per_token(recipe) == expected  # bfloat16
    assert tinymodel.kv_bytes_per_token() == 2048  # the tiny model's, unchanged
    # the same attention-score spread as the tiny model (hidden * std**2)
    tiny = tinymodel.TINY
    assert c["hidden_size"] * recipe.weight_std**2 == pytest.approx(
        tiny.config["hidden_size"] * tiny.weight_std**2
    )


def test_builtin_models_serve_in_their_dtype(tmp_path: Path) -> None:
    common = dict(model_arg="/m", dummy_weights=False, served_name="m", host="h", port=1)
    big = commands.vllm_argv("py", gpu_spec(), lmcache_port=None, **common)
    assert big[big.index("--dtype") + 1] == "bfloat16"
    tiny = commands.vllm_argv("py", gpu_spec(model="builtin:tiny"), lmcache_port=None, **common)
    assert tiny[tiny.index("--dtype") + 1] == "float32"
    chosen = gpu_spec(vllm_args=("--dtype", "float16"))
    argv = commands.vllm_argv("py", chosen, lmcache_port=None, **common)
    assert argv.count("--dtype") == 1 and argv[argv.index("--dtype") + 1] == "float16"


def test_the_tiny_model_serves_eagerly_unless_the_args_choose_a_compilation() -> None:
    common = dict(model_arg="/m", dummy_weights=False, served_name="m", host="h", port=1)

    def argv(**fields: Any) -> list[str]:
        return commands.vllm_argv("py", gpu_spec(**fields), lmcache_port=None, **common)

    assert argv(model="builtin:tiny").count("--enforce-eager") == 1
    assert "--enforce-eager" not in argv()  # builtin:llama-1b compiles (CUDA graphs)
    for chosen in (
        ("--no-enforce-eager",),
        ("-O3",),
        ("-O", "0"),
        ("-O.mode=0",),
        ("--compilation-config", "{}"),
        ("-cc={}",),
    ):
        got = argv(model="builtin:tiny", vllm_args=chosen)
        assert "--enforce-eager" not in got and got[-len(chosen) :] == list(chosen), chosen
    kept = argv(model="builtin:tiny", vllm_args=("--enforce-eager",))
    assert kept.count("--enforce-eager") == 1


def test_each_builtin_model_has_its_own_folder_and_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[tuple[Path, str]] = []

    def fake_build(dest: Path, *, recipe: tinymodel.Recipe = tinymodel.TINY) -> Path:
        built.append((dest, recipe.name))
        return dest

    monkeypatch.setattr(commands, "build_tiny_model", fake_build)
    tiny_dir = tmp_path / "models" / "tiny"
    commands.resolve_model("builtin:tiny", tiny_dir)
    commands.resolve_model("builtin:llama-1b", tiny_dir)
    assert built == [
        (tiny_dir, "builtin:tiny"),
        (tmp_path / "models" / "llama-1b", "builtin:llama-1b"),
    ]
    assert tinymodel._recipe_digest(tinymodel.TINY) != tinymodel._recipe_digest(tinymodel.LLAMA_1B)


def test_identity_names_the_builtin_model(tmp_path: Path) -> None:
    stamp = {"recipe": "r", "files": {"config.json": "c"}}
    (tmp_path / tinymodel.STAMP_NAME).write_text(json.dumps(stamp))
    assert tinymodel.tiny_model_identity(tmp_path).startswith("builtin:tiny:")
    stamp["model"] = "builtin:llama-1b"
    (tmp_path / tinymodel.STAMP_NAME).write_text(json.dumps(stamp))
    assert tinymodel.tiny_model_identity(tmp_path).startswith("builtin:llama-1b:")


def test_gpu_replicas_skip_the_flashinfer_sampler_when_flashinfer_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_find = commands.importlib.util.find_spec

    def find(name: str, *args: Any) -> object:
        return None if name == "flashinfer" else real_find(name, *args)

    monkeypatch.setattr(commands.importlib.util, "find_spec", find)
    spec = gpu_spec(vllm_args=("--gpu-memory-utilization", "0.3"))
    for replica in (None, 0, 1):
        env = commands.env_overrides(spec, replica, base_env={"CUDA_VISIBLE_DEVICES": "0"})
        assert env[commands.FLASHINFER_SAMPLER_VAR] == "0"
    chosen = gpu_spec(env={commands.FLASHINFER_SAMPLER_VAR: "1"})
    assert commands.env_overrides(chosen, None)[commands.FLASHINFER_SAMPLER_VAR] == "1"
    cpu = commands.env_overrides(ManagedSpec(device="cpu"), 0, base_env={})
    assert commands.FLASHINFER_SAMPLER_VAR not in cpu
    monkeypatch.setattr(commands.importlib.util, "find_spec", lambda *a: object())
    assert commands.FLASHINFER_SAMPLER_VAR not in commands.env_overrides(spec, None)


def test_llama_8b_has_an_8b_class_shape_and_holds_128k_in_a_share_of_one_h100() -> None:
    recipe = tinymodel.RECIPES["builtin:llama-8b"]
    params = sum(math.prod(shape) for shape in tinymodel.weight_shapes(recipe).values())
    assert 7.0e9 < params < 8.0e9
    weights = params * 2  # bfloat16
    kv_128k = 131072 * tinymodel.kv_bytes_per_token(recipe)
    assert tinymodel.kv_bytes_per_token(recipe) == 128 * 1024  # Llama-3-8B's
    # two replicas on one 80 GB card at 0.45 of it each: weights + a 128k KV cache fit
    assert weights + kv_128k < 0.45 * 80e9
    assert recipe.config["max_position_embeddings"] >= 131072
    tiny = tinymodel.TINY
    assert recipe.config["hidden_size"] * recipe.weight_std**2 == pytest.approx(
        tiny.config["hidden_size"] * tiny.weight_std**2
    )
    # drawn on the GPU where there is one; the recipe digest says so
    assert recipe.draw_device == "cuda"
    assert tinymodel._recipe_digest(recipe) != tinymodel._recipe_digest(
        tinymodel.Recipe(**{**recipe.__dict__, "draw_device": "cpu"})
    )
