"""``labkit serve``'s engine flags come from EngineConfig's fields: none forgotten, same allowed values, same checks."""

import argparse
import dataclasses

import pytest

from labkit.engine.config import KV_CACHE_DTYPES, EngineConfig
from labkit.kv.tier_policy import BACKENDS
from labkit.serve.serve_cli import NOT_FLAGS, add_arguments, engine_dials, flag_of


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def actions_by_flag() -> dict[str, argparse.Action]:
    return {option: action for action in serve_parser()._actions for option in action.option_strings}


FIELDS = dataclasses.fields(EngineConfig)


def test_every_engine_setting_is_a_flag_or_says_why_not():
    actions = actions_by_flag()
    for setting in FIELDS:
        assert setting.metadata.get("help"), f"EngineConfig.{setting.name} has no help: declare it with setting(...)"
        if setting.name in NOT_FLAGS:
            assert NOT_FLAGS[setting.name], f"say why {setting.name} is not a labkit serve flag"
            assert flag_of(setting) not in actions
            continue
        action = actions.get(flag_of(setting))
        assert action is not None, f"EngineConfig.{setting.name} has no labkit serve flag ({flag_of(setting)})"
        assert action.dest == setting.name and action.help == setting.metadata["help"]
    assert set(NOT_FLAGS) <= {setting.name for setting in FIELDS}, "NOT_FLAGS names a setting EngineConfig lacks"


def test_each_flags_choices_are_the_settings_allowed_values():
    actions = actions_by_flag()
    for setting in FIELDS:
        if setting.name in NOT_FLAGS:
            continue
        allowed = setting.metadata.get("choices", ())
        assert tuple(actions[flag_of(setting)].choices or ()) == allowed, setting.name
        for value in allowed:  # the config takes each value it declares, and refuses any other
            EngineConfig(**{setting.name: value})
        if allowed:
            with pytest.raises(ValueError, match=setting.name):
                EngineConfig(**{setting.name: "not-" + allowed[0]})
    by_name = {setting.name: setting.metadata["choices"] for setting in FIELDS}
    assert by_name["kv_cache_dtype"] == KV_CACHE_DTYPES and by_name["kv_offloading_backend"] == BACKENDS


def test_the_flags_vllm_names_differently_keep_vllms_name():
    actions = actions_by_flag()
    assert actions["--num-gpu-blocks-override"].dest == "num_blocks"
    assert (
        "--deterministic" in actions
        and "--enable-prefix-caching" in actions
        and "--no-enable-chunked-prefill" in actions
    )
    assert engine_dials(serve_parser().parse_args(["--num-gpu-blocks-override", "12"])) == {"num_blocks": 12}
    assert engine_dials(serve_parser().parse_args([])) == {}  # nothing given: the engine's defaults


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--max-num-seqs", "0"], "max_num_seqs must be a whole number >= 1"),
        (["--max-num-seqs", "many"], "expected int, got 'many'"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must be a share in (0, 1]"),
        (["--kv-offloading-size", "0"], "kv_offloading_size must be a number of GiB > 0"),
        (["--kv-cache-dtype", "int8"], "kv_cache_dtype must be 'auto'"),
    ],
)
def test_a_bad_value_is_refused_with_the_configs_own_reason(flags, said, capsys):
    with pytest.raises(SystemExit):
        serve_parser().parse_args(flags)
    err = capsys.readouterr().err
    assert flags[0] in err and said in err
