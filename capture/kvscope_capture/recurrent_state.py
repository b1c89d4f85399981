"""A state-space layer's recurrent state as a bundle holds it (docs/bundle-format.md, "Recurrent
state (hybrid models)"): named parts [checkpoints, units, ...], per TP rank on the engine's side
with the whole-model unit of each row, whole on the reference's; checkpoint i is the state after
the positions [0, positions[i]).

The checks here are the writer's: each call is checked on its own, and the engine's and the
reference's records of a layer against each other once both are there."""

import numpy as np

from .tensors import to_array, to_int_array

STATE_DTYPES = ("float32", "bfloat16", "float16")
STATE_SPEC_TYPES = ("MambaSpec",)  # vLLM keeps every recurrent state (Mamba1/2, GDN, ...) in MambaSpec groups


class StateRecord:
    """What one side holds of one layer: positions [c] and, per rank (the reference: one), {part:
    (bits, dtype, units or None)}; the shape of a part is [c, units, ...]."""

    def __init__(self, where, positions, ranks, kind=None):
        self.where, self.positions, self.ranks, self.kind = where, positions, ranks, kind

    def parts(self):
        return sorted(self.ranks[0])

    def trailing(self, part):
        return self.ranks[0][part][0].shape[2:]

    def dtype(self, part):
        return self.ranks[0][part][1]


def check_layer(cfg, layer, where):
    """The layer is one of the config's state-space layers (a MambaSpec group's)."""
    if not isinstance(layer, str) or layer not in cfg.layer_to_group:
        raise ValueError(f"{where}: layer {layer!r} belongs to no group of the KV cache config")
    spec = cfg.groups[cfg.layer_to_group[layer]]["spec_type"]
    if spec not in STATE_SPEC_TYPES:
        raise ValueError(f"{where}: layer {layer} is in a {spec} group; a recurrent state belongs to a layer of a "
                         f"{' or '.join(STATE_SPEC_TYPES)} group")


def check_positions(positions, limit, where):
    """Checkpoint positions: increasing, each in 1..limit (the prompt's positions)."""
    values = to_int_array(positions, f"{where}: positions").reshape(-1)
    if values.size == 0:
        raise ValueError(f"{where}: positions is empty; a state has at least one checkpoint")
    if np.any(np.diff(values) <= 0):
        at = int(np.argmax(np.diff(values) <= 0)) + 1
        raise ValueError(f"{where}: positions are not increasing ({int(values[at - 1])} then {int(values[at])} at "
                         f"checkpoint {at})")
    if values[0] < 1 or values[-1] > limit:
        bad = int(values[0] if values[0] < 1 else values[-1])
        raise ValueError(f"{where}: position {bad} outside 1..{limit} (a checkpoint is the state after the positions "
                         f"[0, p) of the prompt's {limit})")
    return values


def _check_part_name(part, what):
    """A part's name: a plain HDF5 name of up to 64 characters, not 'positions' nor ending '_units'
    (the names beside it)."""
    if not isinstance(part, str) or not part or "/" in part or len(part) > 64 or part.endswith("_units") \
            or part in ("positions", ".", ".."):
        raise ValueError(f"{what}: a part is named by a plain HDF5 name of up to 64 characters, not 'positions' "
                         "nor ending '_units'")


def _state_tensor(value, checkpoints, where):
    array, dtype = to_array(value, where)
    if dtype not in STATE_DTYPES:
        raise ValueError(f"{where}: dtype {dtype}; a state is {', '.join(STATE_DTYPES)}")
    if array.ndim < 2:
        raise ValueError(f"{where}: shape {tuple(array.shape)}, expected [checkpoints, units, ...]")
    if array.shape[0] != checkpoints:
        raise ValueError(f"{where}: {array.shape[0]} checkpoints (axis 0) for {checkpoints} positions")
    return np.ascontiguousarray(array), dtype


def engine_record(layer, positions, per_rank, tp_size, kind, where):
    """per_rank: {rank: {part: (tensor, units)}} for every rank 0..tp_size-1 (a list is taken as
    ranks in order)."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{where}: kind must name the state's model (e.g. 'mamba2'), got {kind!r}")
    if isinstance(per_rank, (list, tuple)):
        per_rank = dict(enumerate(per_rank))
    if not isinstance(per_rank, dict):
        raise ValueError(f"{where}: the state must be {{rank: {{part: (tensor, units)}}}}")
    ranks = sorted(per_rank, key=lambda r: (not isinstance(r, int), r))
    if ranks != list(range(tp_size)):
        raise ValueError(f"{where}: ranks {ranks}, the config has tp_size {tp_size} (ranks 0..{tp_size - 1})")
    out = []
    for r in ranks:
        parts = per_rank[r]
        if not isinstance(parts, dict) or not parts:
            raise ValueError(f"{where}, rank {r}: must be {{part: (tensor, units)}} with at least one part")
        held = {}
        for part, entry in parts.items():
            what = f"{where}, rank {r}, part {part}"
            _check_part_name(part, what)
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ValueError(f"{what}: expected (tensor, units)")
            array, dtype = _state_tensor(entry[0], len(positions), what)
            units = to_int_array(entry[1], f"{what}: units").reshape(-1)
            if len(units) != array.shape[1]:
                raise ValueError(f"{what}: {len(units)} units for {array.shape[1]} rows (axis 1)")
            if np.any(units < 0):
                raise ValueError(f"{what}: unit {int(units[units < 0][0])} is negative")
            if len(np.unique(units)) != len(units):
                raise ValueError(f"{what}: a unit is listed twice in one rank")
            held[part] = (array, dtype, units)
        if out:
            first = out[0]
            missing = sorted(set(first) - set(held))
            extra = sorted(set(held) - set(first))
            if missing or extra:
                name = (missing or extra)[0]
                raise ValueError(f"{where}, part {name}: rank {r} {'lacks' if missing else 'has'} part {name}"
                                 f"{'' if missing else ', which rank 0 lacks'}; every rank holds the same parts")
            for part, (array, dtype, _) in held.items():
                if array.shape[2:] != first[part][0].shape[2:]:
                    raise ValueError(f"{where}, part {part}: rank {r}'s trailing axes {array.shape[2:]} differ from "
                                     f"rank 0's {first[part][0].shape[2:]}")
                if dtype != first[part][1]:
                    raise ValueError(f"{where}, part {part}: rank {r} holds {dtype}, rank 0 {first[part][1]}")
        out.append(held)
    return StateRecord(where, positions, out, kind)


def reference_record(layer, positions, parts, where):
    """parts: {part: tensor [c, units, ...]}, the whole model's state."""
    if not isinstance(parts, dict) or not parts:
        raise ValueError(f"{where}: the state must be {{part: tensor}} with at least one part")
    held = {}
    for part, value in parts.items():
        what = f"{where}, part {part}"
        _check_part_name(part, what)
        array, dtype = _state_tensor(value, len(positions), what)
        held[part] = (array, dtype, None)
    return StateRecord(where, positions, [held])


def check_against(engine, reference, prompt, layer):
    """The engine's record against the reference's: the same parts, the same trailing axes, units
    within the reference's and each of them held by some rank."""
    where = f"prompt {prompt}, layer {layer}"
    if engine.parts() != reference.parts():
        missing = sorted(set(reference.parts()) - set(engine.parts()))
        extra = sorted(set(engine.parts()) - set(reference.parts()))
        name = (missing or extra)[0]
        raise ValueError(f"{where}, part {name}: the {'reference' if missing else 'engine'} holds it and the "
                         f"{'engine' if missing else 'reference'} does not")
    for part in engine.parts():
        ref = reference.ranks[0][part][0]
        if engine.trailing(part) != ref.shape[2:]:
            raise ValueError(f"{where}, part {part}: the engine's trailing axes {engine.trailing(part)} do not match "
                             f"the reference's {ref.shape[2:]} (shape {tuple(ref.shape)})")
        total = ref.shape[1]
        covered = np.zeros(total, bool)
        for r, held in enumerate(engine.ranks):
            units = held[part][2]
            if units.size and units.max() >= total:
                raise ValueError(f"{where}, part {part}: rank {r} lists unit {int(units.max())}, out of range: the "
                                 f"reference has {total} units (0..{total - 1})")
            covered[units] = True
        if not covered.all():
            raise ValueError(f"{where}, part {part}: unit {int(np.argmin(covered))} of the reference's {total} is held "
                             "by no rank")


def write_engine(group, record, tp_size, dataset, set_string):
    """/prompts/<id>/engine/states/<L>: attributes kind and tp_size, positions, rank_<r>/<part>
    and rank_<r>/<part>_units."""
    set_string(group, "kind", record.kind)
    group.attrs["tp_size"] = np.int64(tp_size)
    dataset(group, "positions", record.positions.astype(np.int64))
    for r, held in enumerate(record.ranks):
        rank = group.create_group(f"rank_{r}", track_order=True)
        for part, (array, dtype, units) in held.items():
            set_string(dataset(rank, part, array), "dtype", dtype)
            dataset(rank, part + "_units", units.astype(np.int64))


def write_reference(group, record, dataset, set_string):
    """/prompts/<id>/reference/<role>/states/<L>: positions and <part>."""
    dataset(group, "positions", record.positions.astype(np.int64))
    for part, (array, dtype, _) in record.ranks[0].items():
        set_string(dataset(group, part, array), "dtype", dtype)
