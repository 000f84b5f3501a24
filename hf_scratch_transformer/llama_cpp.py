"""What llama.cpp computes otherwise than a `to_hf` export that it converts to GGUF (`llama_cpp_caveats`): its
converter and graphs, read in its source and run where noted (docs/native_models.md, "GGUF and llama.cpp")."""

import copy

import torch
import transformers
from transformers import PreTrainedModel

from .conversion import ACTIVATIONS

# What llama.cpp (its convert_hf_to_gguf.py and the graphs that run the GGUF; checked at llama.cpp 0c1e57098,
# docs/native_models.md "GGUF and llama.cpp") computes differently from an exported model that it converts.
LLAMA_CPP_GPT2_ACTIVATION = "gelu_new"  # its GPT-2 graph's GELU (tanh), whatever `activation_function` says
# RoPE scaling of a Llama / Mistral export, read in llama.cpp's source (not run): convert_hf_to_gguf.py a458664,
# `TextModel.set_gguf_parameters` (the scaling keys it writes per `rope_type`) and `LlamaModel.generate_extra_tensors`
# (llama3's frequency factors); the runtime of that time: the Llama graph (src/models/llama.cpp) turns queries and
# keys with `ggml_rope_ext` (ggml's `rope_yarn`, `ggml_rope_yarn_corr_dims`), `llama_model::load_hparams` reads YaRN's
# beta and attention-factor keys for other architectures only, and YaRN's attention factor comes from `factor` alone
# (PR 17945). Each rule says what transformers would compute as llama.cpp does, and a caveat is given only where that
# turns queries or keys otherwise than the model's own parameters.
LLAMA_CPP_LLAMA3_CONTEXT = 8192  # llama3's `original_max_position_embeddings` where the converter finds none
# Position 0 attends to itself alone, so no angle or scale changes its output.
FROM_POSITION_1 = "so outputs differ from position 1 on"


def _rope_tables(config, rope_parameters: dict) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and cos/sin scale of Llama's rotary embedding (as built, before any length-dependent
    update) for `config` with these `rope_parameters`."""
    config = copy.deepcopy(config)
    config.rope_parameters = dict(rope_parameters)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    return rotary.inv_freq, rotary.attention_scaling


def _same_rope(config, rope_parameters: dict) -> bool:
    """Whether `rope_parameters` turn queries and keys exactly as the config's own do."""
    (ours, our_scale), (theirs, their_scale) = (_rope_tables(config, config.rope_parameters),
                                                _rope_tables(config, rope_parameters))
    return torch.equal(ours, theirs) and our_scale == their_scale


def _without(rope_parameters: dict, *keys: str) -> dict:
    return {key: value for key, value in rope_parameters.items() if key not in keys}


def _plain_rope(config) -> dict:
    """What llama.cpp runs for a RoPE scaling it writes nothing for: every head dimension turned by `rope_theta`."""
    return {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}


def _dynamic_caveats(config) -> list[str]:
    return [f"rope_type='dynamic': llama.cpp's converter writes no scaling for it (it reads 'dynamic' for HunYuan "
            f"only), so llama.cpp runs plain RoPE: the same for inputs of up to max_position_embeddings="
            f"{config.max_position_embeddings} tokens; on longer ones transformers raises the RoPE base with the "
            "length (dynamic NTK) and outputs differ"]


def _yarn_caveats(config) -> list[str]:
    """llama.cpp writes `factor` and `original_max_position_embeddings` and computes YaRN's frequencies and its
    default attention factor (0.1 * ln(factor) + 1) as transformers does; the Llama graph reads none of the other
    knobs."""
    rope, caveats = config.rope_parameters, []
    attention_knobs = [key for key in ("attention_factor", "mscale", "mscale_all_dim") if rope.get(key) is not None]
    llama_cpp = _without(rope, *attention_knobs)
    if attention_knobs and not _same_rope(config, llama_cpp):
        knobs = ", ".join(f"{key}={rope[key]}" for key in attention_knobs)
        caveats.append(f"{knobs} (yarn): llama.cpp's Llama graph scales cos/sin by 0.1 * ln(factor) + 1 = "
                       f"{_rope_tables(config, llama_cpp)[1]:.4g} instead of {_rope_tables(config, rope)[1]:.4g}, "
                       + FROM_POSITION_1)
    for key, default in (("beta_fast", 32), ("beta_slow", 1)):
        if key in rope and not _same_rope(config, _without(rope, key)):
            caveats.append(f"{key}={rope[key]} (yarn): llama.cpp's Llama graph uses {default} (its loader reads the "
                           "key for other architectures only), " + FROM_POSITION_1)
    if not _same_rope(config, _without(rope, "truncate")):
        caveats.append("truncate=False (yarn): llama.cpp always rounds YaRN's correction range to whole dimensions, "
                       + FROM_POSITION_1)
    return caveats


def _longrope_caveats(config) -> list[str]:
    """The converter writes the type and no factors for a Llama (it writes LongRoPE factors for Phi-3), so llama.cpp
    runs plain RoPE, unscaled."""
    rope, caveats = config.rope_parameters, []
    (frequencies, scale), (plain, _) = _rope_tables(config, rope), _rope_tables(config, _plain_rope(config))
    if not torch.equal(frequencies, plain):
        caveats.append("short_factor (longrope): llama.cpp's Llama GGUF has no LongRoPE factors and runs plain RoPE, "
                       + FROM_POSITION_1)
    if scale != 1.0:
        caveats.append(f"longrope's attention factor {scale:.4g}: llama.cpp's Llama graph does not scale cos/sin, "
                       + FROM_POSITION_1)
    if any(factor != 1 for factor in rope["long_factor"]):
        caveats.append(f"long_factor (longrope): transformers uses it for inputs longer than "
                       f"original_max_position_embeddings={rope['original_max_position_embeddings']} tokens, llama.cpp "
                       "never (plain RoPE), so outputs differ on such inputs")
    return caveats


def _llama3_caveats(config) -> list[str]:
    """The converter computes llama3's frequency factors as transformers does, but reads the pretraining length from
    the top of config.json, where transformers does not write it (it keeps it in `rope_parameters`)."""
    rope = config.rope_parameters
    if _same_rope(config, {**rope, "original_max_position_embeddings": LLAMA_CPP_LLAMA3_CONTEXT}):
        return []
    return [f"original_max_position_embeddings={rope['original_max_position_embeddings']} (llama3): llama.cpp's "
            f"converter does not find it and computes the llama3 frequency factors for {LLAMA_CPP_LLAMA3_CONTEXT}, "
            + FROM_POSITION_1]


def _unknown_rope_type_caveats(config) -> list[str]:
    """A type the converter does not know: it warns ("Unknown RoPE type") and writes plain RoPE."""
    rope = config.rope_parameters
    if _same_rope(config, _plain_rope(config)):
        return []
    knobs = ", ".join(f"{key}={value}" for key, value in _without(rope, "rope_type", "rope_theta").items())
    return [f"rope_type={rope['rope_type']!r} ({knobs}): llama.cpp's converter does not know it and writes plain "
            "RoPE (every dimension turned by rope_theta), " + FROM_POSITION_1]


# `rope_type` -> why llama.cpp turns queries and keys otherwise; it computes "default" and "linear" as transformers.
LLAMA_CPP_ROPE_CAVEATS = {
    "default": lambda config: [],
    "linear": lambda config: [],
    "dynamic": _dynamic_caveats,
    "yarn": _yarn_caveats,
    "longrope": _longrope_caveats,
    "llama3": _llama3_caveats,
}


def llama_cpp_caveats(native: PreTrainedModel) -> list[str]:
    """Why a `to_hf` export would not compute its own function in llama.cpp once converted to GGUF: one line per
    cause, none where llama.cpp computes it (the exported tensors themselves convert exactly). llama.cpp's converter
    reads neither GPT-2's `activation_function` nor `n_inner`, nor Mistral's `sliding_window`, and says nothing; of
    `rope_parameters` it computes "default", "linear" and YaRN's frequencies as transformers does, and not dynamic
    NTK, LongRoPE's factors, YaRN's other knobs or llama3 with another pretraining length (`LLAMA_CPP_ROPE_CAVEATS`)."""
    config, caveats = native.config, []
    if config.model_type == "gpt2":
        act = config.activation_function
        if ACTIVATIONS.get(act) == "gelu":
            caveats.append(f"activation_function={act!r}: llama.cpp's GPT-2 graph computes GELU's tanh approximation "
                           "instead of the erf GELU (close, not exact)")
        elif ACTIVATIONS.get(act) != ACTIVATIONS[LLAMA_CPP_GPT2_ACTIVATION]:
            caveats.append(f"activation_function={act!r}: llama.cpp's GPT-2 graph computes GELU (tanh) instead, so "
                           "the GGUF converts without a warning and runs a different model (only 'gelu_tanh' runs "
                           "right)")
        if (config.n_inner or 4 * config.n_embd) != 4 * config.n_embd:
            caveats.append(f"n_inner={config.n_inner}: llama.cpp's converter writes a feed-forward of 4 x n_embd = "
                           f"{4 * config.n_embd}, so llama.cpp refuses to load the GGUF (a tensor of the wrong shape)")
    window = getattr(config, "sliding_window", None)
    if config.model_type == "mistral" and window is not None and window < config.max_position_embeddings:
        caveats.append(f"sliding_window={window}: llama.cpp runs MistralForCausalLM as Llama, attending to every "
                       f"earlier token, so its outputs differ from position {window} on")
    if config.model_type in ("llama", "mistral"):
        rope_type = config.rope_parameters["rope_type"]
        caveats += LLAMA_CPP_ROPE_CAVEATS.get(rope_type, _unknown_rope_type_caveats)(config)
    return caveats
