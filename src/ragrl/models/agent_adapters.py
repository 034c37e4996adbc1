"""One LoRA adapter per agent on one base model (MMOA-RAG's `agent_adapters: per_agent`).

    make_agent_adapters(model, ["rewriter", "selector", "generator"], trainable={"generator"})
    activate_agent(model, "selector")          # from here on the selector's adapter computes

Each agent's adapter starts as a copy of the model's current one (the SFT warm start, or a fresh
LoRA), which is then removed, so the agents begin identical and then diverge; save_pretrained
writes one subfolder per agent (and `reference`, the frozen KL copy, where there is one). The
model remembers which adapter is whose (`AGENT_ADAPTERS`, an attribute), so the rollout engine
and the policy switch by agent name without knowing how the model was built, and a model without
per-agent adapters switches nothing.

peft's `set_adapter` leaves only the active adapter trainable; switching restores the trainable
set, so gradients of several agents' micro batches accumulate into one optimizer step and a frozen
agent's adapter never receives one.
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path

from torch import nn

from ragrl.errors import ModelError

AGENT_ADAPTERS = "ragrl_agent_adapters"     # model attribute: {agent: adapter name}
TRAINABLE = "ragrl_trainable_adapters"      # model attribute: adapter names that train
REFERENCE_ADAPTER = "reference"             # the frozen copy of the adapter a run started from
MERGED = "ragrl_merged_adapter"             # model attribute: a LoRA adapter was folded into its weights


def make_agent_adapters(model: nn.Module, agents: list[str], trainable: set[str] | None = None) -> dict[str, str]:
    """Add one adapter per agent (named after it), each a copy of the active adapter; return the map.
    `trainable`: the agents whose adapters train (default all)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict  # late: peft takes ~3 s to import

    if not hasattr(model, "peft_config"):
        raise ValueError("per-agent adapters need a LoRA (peft) model")
    source = model.active_adapter
    state = get_peft_model_state_dict(model, adapter_name=source)
    for agent in agents:
        if agent in model.peft_config:
            raise ValueError(f"the model already has an adapter named {agent!r}")
        model.add_adapter(agent, copy.deepcopy(model.peft_config[source]))
        set_peft_model_state_dict(model, state, adapter_name=agent)
    mapping = {a: a for a in agents}
    set_agent_adapters(model, mapping, set(agents) if trainable is None else set(trainable))
    model.delete_adapter(source)    # every agent has its copy; an export then holds only theirs
    return mapping


def set_agent_adapters(model: nn.Module, mapping: dict[str, str] | None, trainable: set[str] = frozenset()) -> None:
    """Declare which adapter acts for which agent (None: one shared adapter, no switching) and which
    adapters train. Activates the first agent's adapter."""
    setattr(model, AGENT_ADAPTERS, dict(mapping) if mapping else None)
    setattr(model, TRAINABLE, {mapping[a] for a in trainable} if mapping else set())
    if mapping:
        _activate(model, next(iter(mapping.values())))


def agent_adapter_map(model: nn.Module | None) -> dict[str, str] | None:
    return getattr(peft_model(model), AGENT_ADAPTERS, None) if model is not None else None


def activate_agent(model: nn.Module | None, agent: str | None) -> None:
    """Make `agent`'s adapter the active one until the next switch (nothing changes for a model
    without per-agent adapters, or an agent it has none for). Every per-agent generation and
    forward switches first, so nothing needs restoring afterwards."""
    m = peft_model(model) if model is not None else None
    mapping = getattr(m, AGENT_ADAPTERS, None)
    if mapping and agent in mapping:
        _activate(m, mapping[agent])


def has_saved_start(adapter_dir: str | Path) -> bool:
    """Whether a warm-started run saved its frozen start (`reference/`) beside the adapter in `adapter_dir`."""
    return (Path(adapter_dir) / REFERENCE_ADAPTER / "adapter_config.json").is_file()


def load_adapters(base: nn.Module, adapter_dir: str | Path, *, with_start: bool = False, merge: bool = False) -> nn.Module:
    """A peft model over `base` holding what `adapter_dir` holds: one shared adapter, or one per
    agent (then it switches by agent, as in training). Nothing trains. `with_start`
    (`rollout.answer_by: start`): the frozen start a warm-started run saved beside its adapter
    (`reference/`) is loaded too, as the adapter `reference_context` switches to; it is refused
    when missing (a ModelError), since the base model would then answer in the start's place. `merge`: one shared
    adapter is folded into the base weights (a plain model, for evaluation: the LoRA products are
    not computed at every layer and step; per-agent adapters and a start stay switchable)."""
    from peft import PeftModel  # late: peft takes ~3 s to import

    d = Path(adapter_dir)
    agents = _agent_dirs(d)
    if with_start:
        if agents or not has_saved_start(d):
            raise ModelError(f"{d} holds no frozen start ({REFERENCE_ADAPTER}/ beside one shared adapter) to "
                             "write the answers (rollout.answer_by=start)")
        model = PeftModel.from_pretrained(base, str(d))
        model.load_adapter(str(d / REFERENCE_ADAPTER), adapter_name=REFERENCE_ADAPTER)
        model.set_adapter("default")
        return model
    if not agents:
        model = PeftModel.from_pretrained(base, str(d))
        if not merge:
            return model
        merged = model.merge_and_unload()
        setattr(merged, MERGED, True)   # no adapter left to switch off: `answer_by: base` refuses it
        return merged
    model = PeftModel.from_pretrained(base, str(d / agents[0]), adapter_name=agents[0])
    for agent in agents[1:]:
        model.load_adapter(str(d / agent), adapter_name=agent)
    set_agent_adapters(model, {a: a for a in agents})
    return model


def load_agent_adapters(model: nn.Module, adapter_dir: str | Path, prefix: str = "") -> dict[str, str] | None:
    """Load an exported per-agent adapter folder into a peft model that already has adapters, as
    adapters named prefix + agent; return {agent: adapter name} (for `set_agent_adapters`), or
    None when `adapter_dir` is one shared adapter (nothing is loaded)."""
    d = Path(adapter_dir)
    agents = _agent_dirs(d)
    if not agents:
        return None
    for agent in agents:
        model.load_adapter(str(d / agent), adapter_name=prefix + agent)
    return {a: prefix + a for a in agents}


def _agent_dirs(d: Path) -> list[str]:
    """The per-agent subfolders of an exported adapter folder (save_pretrained writes every adapter
    but `default` in a subfolder; `reference` is the frozen KL copy, not an agent)."""
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / "adapter_config.json").is_file()
                  and p.name not in ("reference", "default"))


def restore_active(model: nn.Module, name: str) -> None:
    """`model.set_adapter(name)`, keeping every per-agent trainable adapter trainable."""
    if getattr(model, AGENT_ADAPTERS, None):
        _activate(model, name)
    else:
        model.set_adapter(name)


@contextlib.contextmanager
def reference_context(model: nn.Module):
    """Context in which `model` computes with the weights its run started from: the frozen
    `reference` adapter where there is one (ragrl.policy.lm_model.freeze_reference), else the base
    model (LoRA adapters off). The KL reference, and `rollout.answer_by: start`'s answer writer."""
    m = peft_model(model)
    if REFERENCE_ADAPTER in getattr(m, "peft_config", {}):
        active = m.active_adapter
        m.set_adapter(REFERENCE_ADAPTER)
        try:
            yield
        finally:
            restore_active(m, active)   # the reference is frozen again; the trainable adapters train
        return
    with (m.disable_adapter() if hasattr(m, "disable_adapter") else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def adapters_off(model: nn.Module):
    """Context in which `model` computes with its base weights, every LoRA adapter off (the frozen
    `reference` too): `rollout.answer_by: base`'s answer writer. A model with no adapters is its base
    already, unless an adapter was merged into it (refused by `check_start_can_answer`)."""
    m = peft_model(model)
    with (m.disable_adapter() if hasattr(m, "peft_config") else contextlib.nullcontext()):
        yield


def _activate(model: nn.Module, name: str) -> None:
    model.set_adapter(name)
    trainable = getattr(model, TRAINABLE, set())
    for pname, p in model.named_parameters():
        if "lora_" in pname:
            p.requires_grad_(any(f".{t}." in pname for t in trainable))


def peft_model(model: nn.Module) -> nn.Module:
    """The peft model itself, under an FSDP / DDP wrapper where there is one."""
    # FSDP / DDP wrap the peft model as .module
    return model.module if hasattr(model, "module") and hasattr(model.module, "peft_config") else model
