"""train.py --init: a fine-tuned policy takes its shape (window, encoder, frame size, core and its sizes) and, unless
told otherwise, its inputs (time, latency, queued actions) from the checkpoint it starts from; a flag that asks for
another shape is refused in one line rather than ignored. ``checkpoint_shape`` gives the arguments the checkpoint
sets, for agent.training.config.resolve."""
from __future__ import annotations

from typing import Any

from policies.checkpoint import read_checkpoint
from policies.config import PolicyConfig

SHAPE = ("policy", "window", "frame_stride", "encoder", "feature_dim", "image_size", "crop", "color",
         "frame_tokens", "head_hidden")  # --init's
CORE_SIZES = ("d_model", "heads", "topk", "sparsity", "nac_mode", "hidden")  # the core's, from --init's core_options


def checkpoint_shape(init: str, given: dict[str, Any], defaults: dict[str, Any], time_input: str | None,
                     latency_input: str | None, latency_queue: int | None) -> dict[str, Any]:
    """--init: the arguments that shape the policy and its input come from the checkpoint, not the flags; the
    time input too unless --time-input is given (it changes what the core is fed, not its weights). ``given``:
    this command's values of SHAPE and CORE_SIZES, ``defaults``: their flags' defaults. A shape or size flag set
    away from its default to something else than the checkpoint's is refused: it would be ignored. Returns the
    arguments the checkpoint sets (its sizes too, so args.json records what trains)."""
    payload = read_checkpoint(init)
    c = PolicyConfig.from_dict(payload["config"])
    label = (payload.get("metadata") or {}).get("policy") or c.core
    shape = dict(policy=str(label), window=c.window, frame_stride=c.frame_stride, encoder=c.encoder,
                 feature_dim=c.feature_dim, image_size=f"{c.image_size[0]}x{c.image_size[1]}",
                 crop="none" if c.crop is None else f"{c.crop[0]}:{c.crop[1]}", color=c.color,
                 frame_tokens=c.frame_tokens, head_hidden=c.head_hidden)
    sizes = _checkpoint_sizes(init, c.core, dict(c.core_options), str(label), given, defaults)
    for name, kept in shape.items():
        if given[name] not in (defaults[name], kept):
            flag = "--" + ("core" if name == "policy" else name.replace("_", "-"))
            raise ValueError(f"--init takes the policy's shape from {init}: {flag} {given[name]} contradicts its "
                             f"{kept}; leave {flag} out to fine-tune it, or train from scratch without --init")
    told = latency_input or c.latency_input
    if c.latency_input == "input" and told != "input":
        raise ValueError(f"--latency-input {told}: {init} reads its latency as an input; fine-tune it with "
                         "--latency-input input, or train from scratch")
    queue = c.queue_steps if latency_queue is None else latency_queue
    if c.queue_steps and queue != c.queue_steps:
        raise ValueError(f"--latency-queue {queue}: {init} is shown {c.queue_steps} actions on their way; leave "
                         "--latency-queue out to fine-tune it, or train from scratch")
    if queue and told != "input":
        raise ValueError(f"--latency-queue {queue} shows the actions on their way beside the latency input; add "
                         "--latency-input input")
    return {**shape, **sizes, "time_input": time_input or c.time_input, "latency_input": told,
            "latency_queue": queue}


def _checkpoint_sizes(init: str, core: str, options: dict[str, Any], label: str, given: dict[str, Any],
                      defaults: dict[str, Any]) -> dict[str, Any]:
    """--init: the size flags (CORE_SIZES) that build the checkpoint's core, as args.json records them; a size
    flag given away from its default that would build another core than the checkpoint's is refused (a flag this
    core does not read, e.g. --topk for an lstm, is ignored as it is without --init)."""
    from policies.cores import core_parameters, policy_core_options

    def widths(opts: dict[str, Any]) -> dict[str, Any]:  # what the core is built with (policies.cores' defaults)
        out = {k: opts.get(k, p.default) for k, p in core_parameters(core).items()}
        if "hidden" in out:  # lstm, gru, mlp: d_model is only the width's default
            width = out.pop("d_model")
            out["hidden"] = out["hidden"] or width
        elif "units" in out:  # cfc, ltc
            width = out.pop("d_model")
            out["units"] = out["units"] or (width if core == "cfc" else max(2, width // 2))
        return out

    def built(sizes: dict[str, Any]) -> dict[str, Any]:
        hidden = None if sizes["hidden"] == defaults["hidden"] else sizes["hidden"]  # as resolve gives it
        return widths(policy_core_options(label, d_model=sizes["d_model"], heads=sizes["heads"], topk=sizes["topk"],
                                          sparsity=sizes["sparsity"], nac_mode=sizes["nac_mode"], hidden=hidden)[1])

    plain, mine = built(defaults), {k: given[k] for k in CORE_SIZES}
    asked, kept = built(mine), widths(options)
    for key in (k for k in asked if asked[k] != plain[k] and asked[k] != kept.get(k)):
        for name in (n for n in CORE_SIZES if built({**mine, n: defaults[n]})[key] != asked[key]):  # its cause
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"--init takes the policy's shape from {init}: {flag} {given[name]} contradicts its "
                             f"{key} {kept.get(key)}; leave {flag} out to fine-tune it, or train from scratch "
                             "without --init")
    record = {k: options[k] for k in ("d_model", "heads", "topk", "sparsity") if k in options and core == "nac"}
    record.update({"nac_mode": options["mode"]} if core == "nac" and "mode" in options else {})
    record.update({"d_model": options["d_model"]} if core != "nac" and "d_model" in options else {})
    if options.get("hidden") or options.get("units"):
        record["hidden"] = options.get("hidden") or options["units"] * (2 if core == "ltc" else 1)
    return record
