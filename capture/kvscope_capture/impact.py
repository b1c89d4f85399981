"""Impact: what the engine's KV does to the reference model's output (docs/bundle-format.md,
"Impact: the engine's KV put into the reference").

The reference model (a HuggingFace causal LM) decodes the teacher tokens reading, in some layers,
the engine's KV instead of its own (or the baseline's, or its own quantised); each step's
next-token distribution is compared with the one it gives reading its own KV everywhere. The engine's KV comes from `kvscope export` (snapshots and
TP ranks merged, dequantised), so that nothing here reads the engine's cache a second way.

Step g takes the teacher token at q = prompt_len + g - 1 with a cache holding positions [0, q):
the engine's in replaced layers, the reference's own (one teacher-forced forward) in the others.
A replaced layer's row at q is the engine's too: the cache's `update`, which every HF attention
calls with the row's new K and V, is wrapped to hand back the engine's rows. Steps are batched as
rows of one forward, each row's past left-padded to the longest (distances between slots are
distances between positions, so causal and sliding-window masks stay right): a transplant costs
ceil(s / batch) forwards of one token per row.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

from .bundle_writer import _dataset, _ordered_group, _set_string, _string_dataset
from .hf_reference import hf_cache_layers
from .kv_cache_config import KvCacheConfig

# A `kvscope whatif` scheme name -> (fp8 format): one scale per layer and part, amax / largest.
SCHEMES = {"fp8_e4m3/tensor": "e4m3fn", "fp8_e5m2/tensor": "e5m2"}
# mantissa bits, smallest normal exponent, largest finite value (OCP e4m3fn: no infinities, 448;
# e5m2: IEEE-like, 57344).
FP8_FORMATS = {"e4m3fn": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}
# The model's KV against the bundle's reference: bf16 rounding and kernels differ by well under 1 %
# (relative RMS); another model's KV by about 1.4 (uncorrelated).
MODEL_MISMATCH = 0.1
# Default budget for the batched steps' caches (every layer's K and V of every row).
STEP_CACHE_BYTES = 1 << 30


# --- fp8 rounding (torch here has no float8 types) ----------------------------------------------

def round_to_fp8(values, fmt):
    """values on the fp8 format's grid: nearest, ties to even, saturating at +-largest (as vLLM
    clamps before its cast); subnormals below the smallest normal. float64 out; NaN stays NaN."""
    mantissa_bits, min_exponent, largest = FP8_FORMATS[fmt]
    x = np.asarray(values, dtype=np.float64)
    magnitude = np.abs(x)
    _, exponent = np.frexp(magnitude)  # magnitude = f * 2^exponent, f in [0.5, 1)
    step = np.ldexp(1.0, np.maximum(exponent - 1, min_exponent) - mantissa_bits)
    with np.errstate(invalid="ignore"):
        rounded = np.minimum(np.round(magnitude / step) * step, largest)  # np.round: ties to even
    return np.copysign(rounded, x)


def quantise_per_tensor(values, scheme):
    """A layer's K or V (float32, any shape) quantised by a per-tensor fp8 scheme and decoded:
    scale = amax / largest (in float32, as kvscope whatif), q = x / scale on the grid, q * scale."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: impact knows {', '.join(SCHEMES)}")
    fmt = SCHEMES[scheme]
    x = np.asarray(values, dtype=np.float32)
    amax = np.float32(np.max(np.abs(x))) if x.size else np.float32(0)
    scale = amax / np.float32(FP8_FORMATS[fmt][2])
    if not scale > 0:
        return x.copy()
    return (round_to_fp8(x / scale, fmt) * np.float64(scale)).astype(np.float32)


# --- KL and top-1 --------------------------------------------------------------------------------

def _log_softmax(logits):
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def kl_and_top1(reference_logits, logits):
    """Per step (rows of [steps, vocab]): KL(reference || other) in nats from log-softmax in
    double (0 for identical rows; rounding's tiny negatives clamped), and whether the argmax moved."""
    ref, other = _log_softmax(reference_logits), _log_softmax(logits)
    kl = np.maximum((np.exp(ref) * (ref - other)).sum(axis=-1), 0.0)
    changed = np.argmax(reference_logits, axis=-1) != np.argmax(logits, axis=-1)
    return kl, changed.astype(np.int8)


# --- the engine's KV, through kvscope export -------------------------------------------------------

def find_kvscope_binary(binary=None):
    """binary if given, else $KVSCOPE_BINARY, else `kvscope` on PATH."""
    binary = binary or os.environ.get("KVSCOPE_BINARY") or shutil.which("kvscope")
    if not binary:
        raise ValueError("the kvscope binary is needed to export the engine's KV: set KVSCOPE_BINARY or put kvscope "
                         "on PATH (or pass --engine-kv EXPORT.h5, written by `kvscope export BUNDLE EXPORT.h5`)")
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise ValueError(f"{binary}: not an executable kvscope binary (KVSCOPE_BINARY or PATH)")
    return binary


def export_engine_kv(bundle, out, prompts, layers, binary=None):
    """Runs `kvscope export BUNDLE OUT --prompt ... --layers ...`; its error, if any, as a ValueError."""
    binary = find_kvscope_binary(binary)
    command = [binary, "export", bundle, out]
    for prompt in prompts:
        command += ["--prompt", prompt]
    command += ["--layers", ",".join(layers)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        message = result.stderr.strip() or result.stdout.strip()
        raise ValueError(f"{bundle}: kvscope export failed ({binary}): {message}")


def read_export_layer(export, path, prompt, layer, role="engine"):
    """(k, v, present) of one prompt and layer of a kvscope export, role "engine", "expected" or
    "baseline": float32 [heads, seq, width] (NaN where absent) and bool [seq]."""
    name = f"prompts/{prompt}/{role}/{layer}"
    if name not in export:
        raise ValueError(f"{path}: no {role} KV of prompt {prompt!r}, layer {layer} (export every layer impact "
                         "replaces: kvscope export BUNDLE OUT.h5 without --layers)")
    group = export[name]
    for part in ("k", "v", "present"):
        if part not in group:
            raise ValueError(f"{path}: prompt {prompt!r}, layer {layer}: no {part} (not a kvscope export?)")
    k, v, present = group["k"][()], group["v"][()], group["present"][()].astype(bool)
    if k.ndim != 3 or k.shape != v.shape or present.shape != (k.shape[1],):
        raise ValueError(f"{path}: prompt {prompt!r}, layer {layer}: k {k.shape}, v {v.shape}, present "
                         f"{present.shape} are not [heads, seq, width] twice and [seq]")
    return k, v, present


def check_same_model(pid, layer, model_kv, bundle_kv):
    """Refuses a model whose K or V of a layer is not the bundle's reference's (relative RMS over
    the positions both hold above MODEL_MISMATCH): the impact of another model's KV means nothing."""
    for part, ours, theirs in zip("kv", model_kv, bundle_kv):
        m = min(ours.shape[1], theirs.shape[1])
        a, b = np.asarray(ours[:, :m], np.float64), np.asarray(theirs[:, :m], np.float64)
        held = np.isfinite(b).all(axis=(0, 2))
        if not held.any():
            continue
        difference = np.sqrt(np.mean((a[:, held] - b[:, held]) ** 2) / max(np.mean(b[:, held] ** 2), 1e-30))
        if difference > MODEL_MISMATCH:
            raise ValueError(f"prompt {pid!r}, layer {layer}: the model's {part} differs from the bundle's reference "
                             f"by {difference:.3g} (relative RMS): not the model (or dtype) of this capture?")


# --- the bundle's prompts ------------------------------------------------------------------------

def read_prompts(path):
    """[(id, prompt_len, input_ids, teacher_tokens, has_baseline)] in the bundle's order, and its
    KvCacheConfig."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such bundle")
    with h5py.File(path, "r") as f:
        if "kv_cache_config" not in f or "prompts" not in f:
            raise ValueError(f"{path}: not a kvscope capture bundle (no kv_cache_config or prompts)")
        if int(f.attrs.get("engine_only", 0)) == 1:
            raise ValueError(f"{path}: an engine-only bundle; impact reads the engine's KV through kvscope export, "
                             "which needs the reference")
        raw = f["kv_cache_config"][0]
        config = KvCacheConfig(json.loads(raw.decode() if isinstance(raw, bytes) else raw))
        prompts = []
        for pid, group in f["prompts"].items():
            teacher = group["teacher_tokens"][()] if "teacher_tokens" in group else np.zeros(0, np.int64)
            prompts.append((pid, int(group.attrs["prompt_len"]), group["input_ids"][()].astype(np.int64),
                            teacher.astype(np.int64), "reference/baseline" in group))
    return prompts, config


def select_layers(spec, layers):
    """kvscope's --layers: comma-separated names or index ranges (3, 0-5) of the compared layers."""
    chosen = []
    for item in filter(None, (spec or "").split(",")):
        if item in layers:
            chosen.append(item)
            continue
        try:
            first, _, last = item.partition("-")
            first, last = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"--layers: {item!r} is neither a layer name nor an index range") from None
        if not 0 <= first <= last < len(layers):
            raise ValueError(f"--layers: {item!r} outside 0-{len(layers) - 1}")
        chosen += layers[first:last + 1]
    return [name for name in layers if name in chosen]


def _check_config(config, path):
    """The HF path replaces full and sliding-window attention layers; the rest it refuses."""
    for group in config.groups:
        if group["compared"] and group["mla"]:
            raise ValueError(f"{path}: MLA layers ({group['layer_names'][0]}, ...): HF's DeepSeek caches K and V per "
                             "head, not the latent kvscope exports; impact's HF path does not support MLA")
        if not group["compared"]:
            raise ValueError(f"{path}: layers of {group['spec_type']} ({group['layer_names'][0]}, ...): impact's HF "
                             "path runs attention-only models (a state-space layer's state cannot be batched by step)")
    if config.raw.get("kv_sharing"):
        raise ValueError(f"{path}: layers sharing another's KV (kv_sharing): not supported by impact's HF path")


# --- the model, step by step -----------------------------------------------------------------------

class _Steps:
    """The per-step forwards of one prompt: `logits(sources)` gives [s, vocab] (float64) with
    `sources` {model layer index: (k, v, row_held)}: that layer reads k, v ([kv_heads, n, width] in
    the model's dtype) for positions [0, q] instead of the reference's own, the row at q only
    where row_held[q] (else the row's own, as computed)."""

    def __init__(self, model, tokens, prompt_len, steps, cache_class, step_batch):
        import torch

        self.torch = torch
        self.model = model
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        self.positions = list(range(prompt_len - 1, prompt_len - 1 + steps))  # q of each step
        self.cache_class = cache_class
        with torch.no_grad():
            out = model(input_ids=self.tokens[None, :self.positions[-1] + 1], past_key_values=cache_class(),
                        use_cache=True)
        # The reference's own KV of positions [0, prompt_len + s - 1): [kv_heads, n, width] per layer.
        self.reference = [(k[0].detach(), v[0].detach()) for k, v in hf_cache_layers(out.past_key_values)]
        n = self.positions[-1] + 1
        for i, (k, _) in enumerate(self.reference):
            if k.shape[1] != n:
                raise ValueError(f"the model's cache of layer {i} holds {k.shape[1]} of {n} positions (a cache that "
                                 "trims sliding-window layers); impact needs them all")
        row_bytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.reference)
        self.step_batch = step_batch or max(1, STEP_CACHE_BYTES // max(1, row_bytes))
        self.forwards = 0

    def logits(self, sources):
        out = []
        for start in range(0, len(self.positions), self.step_batch):
            out.append(self._chunk(self.positions[start:start + self.step_batch], sources))
        return np.concatenate(out)

    def _chunk(self, positions, sources):
        torch = self.torch
        q = torch.tensor(positions, device=self.device)
        longest = int(q.max())
        pad = longest - q  # row b's past [0, q_b) sits in slots [pad_b, longest), its token in slot `longest`
        slots = torch.arange(longest, device=self.device)
        index = (slots[None, :] - pad[:, None]).clamp(min=0)  # [B, longest]: the position in each slot
        mask = torch.cat([slots[None, :] >= pad[:, None], torch.ones(len(positions), 1, dtype=torch.bool,
                                                                      device=self.device)], dim=1)
        cache = self.cache_class()
        for layer, (k_ref, v_ref) in enumerate(self.reference):
            k, v = sources[layer][:2] if layer in sources else (k_ref, v_ref)
            cache.update(k[:, index].transpose(0, 1).contiguous(), v[:, index].transpose(0, 1).contiguous(), layer)
        rows = {}
        for layer, (k, v, held) in sources.items():
            use = held[q]
            if bool(use.any()):
                rows[layer] = (use, k[:, q].transpose(0, 1), v[:, q].transpose(0, 1))  # [B, kv_heads, width]
        original = cache.update

        def update(key_states, value_states, layer_idx, cache_kwargs=None, *args, **kwargs):
            keys, values = original(key_states, value_states, layer_idx, cache_kwargs, *args, **kwargs)
            if layer_idx in rows:  # the replaced layer's own row: the engine's
                use, k_row, v_row = rows[layer_idx]
                keys, values = keys.clone(), values.clone()
                keys[use, :, -1] = k_row[use]
                values[use, :, -1] = v_row[use]
            return keys, values

        cache.update = update
        with torch.no_grad():
            result = self.model(input_ids=self.tokens[q][:, None], attention_mask=mask.long(),
                                position_ids=q[:, None], past_key_values=cache, use_cache=True)
        self.forwards += 1
        return result.logits[:, -1].double().cpu().numpy()

    def as_model(self, array):
        return self.torch.as_tensor(array, device=self.device).to(self.dtype)


def prompt_impact(model, prompt, config, exported, schemes=(), cache_class=None, step_batch=None, layers=None):
    """The impact record of one prompt: (transplants [dicts], kl [t, s] float64, top1_changed [t, s]
    int8, forwards). prompt: (id, prompt_len, input_ids, teacher_tokens, has_baseline);
    exported(role, layer) -> (k, v, present) of the export's "engine", "expected" (checked against
    the model's own) or "baseline" KV; layers: the compared layers given `layer`, `from` (and with a
    baseline `baseline`, `baseline_from`) rows (default all)."""
    pid, prompt_len, input_ids, teacher, has_baseline = prompt
    if len(teacher) == 0:
        raise ValueError(f"prompt {pid!r} has no teacher tokens: impact measures the decode steps that predict them")
    compared = config.layer_names()
    every = config.all_layer_names()
    layers = compared if layers is None else layers
    tokens = np.concatenate([input_ids[:prompt_len], teacher])
    steps = _Steps(model, tokens, prompt_len, len(teacher), cache_class, step_batch)
    if len(steps.reference) != len(every):
        raise ValueError(f"prompt {pid!r}: the model caches {len(steps.reference)} layers, the bundle's KV cache "
                         f"config lists {len(every)}: not the model of this capture?")
    index = {name: every.index(name) for name in compared}
    n = steps.positions[-1] + 1
    last = n - 1  # the last step's position, which the engine must hold

    sources, checked = {}, set()

    def exported_source(role, layer):
        """The export's KV of `role` in layer, where it holds positions, the reference's own elsewhere."""
        if (role, layer) not in sources:
            k_ref, v_ref = steps.reference[index[layer]]
            if layer not in checked:
                check_same_model(pid, layer, (k_ref.float().cpu().numpy(), v_ref.float().cpu().numpy()),
                                 exported("expected", layer)[:2])
                checked.add(layer)
            k, v, present = exported(role, layer)
            if k.shape[0] != k_ref.shape[0] or k.shape[2] != k_ref.shape[2]:
                raise ValueError(f"prompt {pid!r}, layer {layer}: the {role}'s KV has {k.shape[0]} heads of width "
                                 f"{k.shape[2]}, the model's {k_ref.shape[0]} of {k_ref.shape[2]}")
            held = np.zeros(n, bool)  # positions it holds (past its export: none)
            m = min(n, k.shape[1])
            held[:m] = present[:m] & np.isfinite(k[:, :m]).all(axis=(0, 2)) & np.isfinite(v[:, :m]).all(axis=(0, 2))
            if not held[last]:
                raise ValueError(f"prompt {pid!r}, layer {layer}: the {role} does not hold position {last} (the last "
                                 "step's), which impact needs")
            where = steps.torch.as_tensor(held, device=steps.device)
            merged = []
            for part, ref in ((k, k_ref), (v, v_ref)):
                values = ref.clone()
                values[:, where] = steps.as_model(part[:, :m][:, held[:m]])
                merged.append(values)
            sources[(role, layer)] = (merged[0], merged[1], where)
        return sources[(role, layer)]

    def scheme_source(layer, scheme):
        k_ref, v_ref = steps.reference[index[layer]]
        decoded = [steps.as_model(quantise_per_tensor(x.float().cpu().numpy(), scheme)) for x in (k_ref, v_ref)]
        return decoded[0], decoded[1], steps.torch.ones(n, dtype=steps.torch.bool, device=steps.device)

    reference_logits = steps.logits({})
    if not np.isfinite(reference_logits).all():
        raise ValueError(f"prompt {pid!r}: the model's logits are not finite")
    transplants, kl, top1 = [], [], []
    done = {}

    def record(row, key, make_sources):
        if key not in done:
            logits = steps.logits(make_sources())
            if not np.isfinite(logits).all():
                raise ValueError(f"prompt {pid!r}, transplant {json.dumps(row)}: the logits are not finite")
            done[key] = kl_and_top1(reference_logits, logits)
        transplants.append(row)
        kl.append(done[key][0])
        top1.append(done[key][1])

    for role, alone, onwards in (("engine", "layer", "from"), ("baseline", "baseline", "baseline_from")):
        if role == "baseline" and not has_baseline:
            continue
        for layer in layers:
            record({"kind": alone, "layer": layer}, (role, layer),
                   lambda role=role, layer=layer: {index[layer]: exported_source(role, layer)})
        for layer in layers:
            later = compared[compared.index(layer):]
            record({"kind": onwards, "layer": layer}, (role,) + tuple(later) if len(later) > 1 else (role, layer),
                   lambda role=role, later=later: {index[name]: exported_source(role, name) for name in later})
    for scheme in schemes:
        for layer in layers:
            record({"kind": "scheme", "layer": layer, "scheme": scheme}, ("scheme", scheme, layer),
                   lambda layer=layer, scheme=scheme: {index[layer]: scheme_source(layer, scheme)})
    return transplants, np.array(kl, np.float64), np.array(top1, np.int8), steps.forwards


def write_impact(path, records):
    """records {prompt id: (transplants, kl, top1, computed_by, seconds)} into the bundle, each
    prompt's impact/ group replaced (docs/bundle-format.md)."""
    with h5py.File(path, "r+", libver="latest") as f:
        for pid, (transplants, kl, top1, computed_by, seconds) in records.items():
            prompt = f["prompts"][pid]
            if "impact" in prompt:
                del prompt["impact"]
            group = _ordered_group(prompt, "impact")
            _set_string(group, "computed_by", computed_by)
            if seconds is not None:
                group.attrs["seconds"] = np.float64(seconds)
            _string_dataset(group, "transplants", [json.dumps(row) for row in transplants])
            _dataset(group, "kl", np.asarray(kl, np.float64))
            _dataset(group, "top1_changed", np.asarray(top1, np.int8))


def impact_bundle(bundle, model, model_name="", engine_kv=None, prompts=None, layers=None, schemes=(),
                  cache_class=None, step_batch=None, binary=None, log=None):
    """Computes and writes the impact record of the bundle's prompts (default: every prompt with
    teacher tokens). model: a HF causal LM (or one with its call interface and cache API);
    engine_kv: a `kvscope export` of the bundle, else one is made with the kvscope binary (binary,
    $KVSCOPE_BINARY or PATH); layers: a --layers spec of the layers given `layer` / `from` rows;
    schemes: per-tensor fp8 schemes also recorded. Returns {prompt id: (transplants, kl, top1)}."""
    log = log or (lambda line: None)
    bundle = os.fspath(bundle)
    available, config = read_prompts(bundle)
    _check_config(config, bundle)
    for scheme in schemes:
        if scheme not in SCHEMES:
            raise ValueError(f"--schemes: {scheme!r} is not one impact computes ({', '.join(SCHEMES)})")
    if cache_class is None:
        from transformers import DynamicCache
        cache_class = DynamicCache
    if any(g["attention_chunk_size"] for g in config.groups):
        step_batch = 1  # chunk boundaries are slot indices in HF's masks: no padding, one step per forward
    by_id = {p[0]: p for p in available}
    if prompts:
        unknown = [p for p in prompts if p not in by_id]
        if unknown:
            raise ValueError(f"{bundle}: no prompt {unknown[0]!r} (it has {', '.join(list(by_id)[:5])})")
        chosen = [by_id[p] for p in prompts]
        for p in chosen:
            if len(p[3]) == 0:
                raise ValueError(f"{bundle}: prompt {p[0]!r} has no teacher tokens: impact measures the decode steps "
                                 "that predict them")
    else:
        chosen = [p for p in available if len(p[3])]
        for p in available:
            if not len(p[3]):
                log(f"prompt {p[0]}: no teacher tokens, skipped")
        if not chosen:
            raise ValueError(f"{bundle}: no prompt has teacher tokens: impact measures the decode steps that "
                             "predict them")
    compared = config.layer_names()
    selected = select_layers(layers, compared) if layers else compared
    if not selected:
        raise ValueError("--layers: no layer chosen")
    needed = compared[compared.index(selected[0]):]  # `from` rows replace every later layer too
    computed_by = f"kvscope_capture impact ({model_name})" if model_name else "kvscope_capture impact"
    with tempfile.TemporaryDirectory() as tmp:
        export = engine_kv
        if export is None:
            export = os.path.join(tmp, "engine.h5")
            started = time.perf_counter()
            export_engine_kv(bundle, export, [p[0] for p in chosen], needed, binary)
            log(f"kvscope export: {time.perf_counter() - started:.1f} s")
        elif not os.path.isfile(export):
            raise ValueError(f"{export}: no such engine KV export (kvscope export BUNDLE {export})")
        records, results = {}, {}
        with h5py.File(export, "r") as exported:
            if exported.attrs.get("format", b"") not in (b"kvscope-export", "kvscope-export"):
                raise ValueError(f"{export}: not a kvscope export (its root attribute format is not kvscope-export)")
            for prompt in chosen:
                started = time.perf_counter()
                pid = prompt[0]
                transplants, kl, top1, forwards = prompt_impact(
                    model, prompt, config, lambda role, layer: read_export_layer(exported, export, pid, layer, role),
                    schemes, cache_class, step_batch, selected)
                seconds = time.perf_counter() - started
                log(f"prompt {prompt[0]}: {len(transplants)} transplants x {len(prompt[3])} steps, {forwards} "
                    f"forwards, {seconds:.1f} s")
                records[prompt[0]] = (transplants, kl, top1, computed_by, seconds)
                results[prompt[0]] = (transplants, kl, top1)
    write_impact(bundle, records)
    return results


def load_and_run(args):
    """The command line's `impact`: loads the HF model (transformers imported only here)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache
    except ImportError as e:
        raise ValueError(f"impact needs torch and transformers ({e})") from e
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=dtype).to(device).eval()
    schemes = [s for s in (args.schemes or "").split(",") if s]
    return impact_bundle(args.bundle, model, model_name=args.model, engine_kv=args.engine_kv, prompts=args.prompt,
                         layers=args.layers, schemes=schemes, cache_class=DynamicCache, step_batch=args.step_batch,
                         log=lambda line: print(line, file=sys.stderr))
