"""A state-space layer's recurrent state as a vLLM worker holds it, read into kvscope's form
(docs/bundle-format.md, "Recurrent state"), and which states a step keeps (the scheduler side).

What vLLM holds (read in vllm-project/vllm; /work/notes/vllm-current-facts.md, "Mamba state"):
- A MambaSpec layer's cache is a page per block: its states packed one after another, each
  `prod(shape) * itemsize` bytes in the order of spec.shapes / spec.dtypes
  (vllm/model_executor/layers/mamba/abstract.py MambaBase.bind_kv_cache); the connector is
  registered the int8 page view [num_blocks, 1, 1, page bytes] (vllm/v1/worker/gpu/attn_utils.py).
- Mamba2 (mamba_mixer2.py, mamba_utils.py MambaStateShapeCalculator.mamba2_state_shape): states
  (conv, ssm); conv (d_conv - 1, conv_dim / tp) in the default "SD" layout, (conv_dim / tp,
  d_conv - 1) with VLLM_SSM_CONV_STATE_LAYOUT=DS, the last d_conv - 1 inputs of the causal
  convolution, oldest first; conv_dim = heads * head_dim + 2 * n_groups' * d_state, a rank's
  channels its share of x, then of B's groups, then of C's; n_groups' = n_groups, or tp when
  n_groups is not a multiple of tp (vLLM allows that for one group only: every rank then holds
  it whole, extra_groups_for_head_shards). ssm (heads / tp, head_dim, d_state), a rank's heads
  consecutive.
- Gated DeltaNet (gdn/qwen_gdn_linear_attn.py, gated_delta_net_state_shape): states (conv,
  recurrent); conv channels q | k | v (num_k_heads * head_k_dim twice, num_v_heads * head_v_dim),
  each split over the ranks; recurrent (num_v_heads / tp, head_v_dim, head_k_dim), which the
  bundle keeps in HF's order [heads, head_k_dim, head_v_dim].
- mamba_cache_mode (vllm/config/cache.py): "none" (prefix caching off): one block a request
  (mamba_block_size = max_model_len), the state after the request's last computed token. "all":
  slot j of the request's Mamba block table holds the state after (j + 1) * block_size tokens and
  the last slot the latest state; a prefill step writes every boundary it crosses. "align": the
  state of each step's last token, in slot (end - 1) // block_size, kept when the step ends on a
  block boundary (prefill chunks are cut there, _mamba_block_aligned_split). In every mode the
  scheduler frees a request's earlier state blocks as it advances (MambaManager.
  get_num_skipped_tokens = num_computed_tokens - 1): a boundary's state must be copied in the
  step that wrote it, not when the request finishes."""

import math

MAMBA2 = "mamba2"
GDN = "gated_delta_net"
# vLLM's mamba_type (MambaAttentionBackendEnum's name, or the string of older vLLM) -> the bundle's kind
KINDS = {"mamba2": MAMBA2, "gdn_attn": GDN, "gdn_attention": GDN}


def _kind(spec):
    kind = getattr(spec, "mamba_type", MAMBA2)
    name = str(getattr(kind, "name", kind)).lower()
    return KINDS.get(name, name)


def _itemsize(dtype):
    import torch

    return torch.tensor([], dtype=dtype).element_size()


def hf_text_config(model_config):
    """The model's HF (text) config, whose fields say what a state's channels are."""
    return getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)


def _hf_int(hf, *keys):
    for key in keys:
        value = getattr(hf, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class MambaStateLayout:
    """One Mamba2 or Gated DeltaNet layer's states on one TP rank: which whole-model units its rows
    are, and how to read them out of its page. The Mamba2 n_groups (Mamba2, NemotronH: n_groups;
    Granite 4, Falcon-H1: mamba_n_groups) and Gated DeltaNet's head counts come from hf_config. `why_not` is set (and nothing is read) for a state kvscope does not
    read, saying why; the engine still runs and its attention is captured."""

    def __init__(self, spec, tp_size, tp_rank, hf_config, what):
        self.what = what
        self.kind = _kind(spec)
        self.block_size = int(spec.block_size)
        self.mode = str(getattr(spec, "mamba_cache_mode", "none"))
        self.shapes = [tuple(int(x) for x in shape) for shape in spec.shapes]
        self.dtypes = list(spec.dtypes)
        self.page_bytes = self.content_bytes = None
        self.why_not = None
        self.units = {}
        self.state_part = "recurrent" if self.kind == GDN else "ssm"
        try:
            if self.kind not in (MAMBA2, GDN):
                raise _NotRead(f"a {self.kind} state (kvscope reads Mamba2 and Gated DeltaNet states)")
            if len(self.shapes) != 2:
                raise _NotRead(f"{len(self.shapes)} states where the layer has (conv, {self.state_part}): with "
                               "ReplaySSM (use_replayssm) the SSM state in the block lags the ring of recent steps")
            if int(getattr(spec, "num_speculative_blocks", 0) or 0):
                raise _NotRead("speculative decoding keeps a state per draft and conv columns per draft")
            if getattr(spec, "tp_replicated", False):
                tp_size, tp_rank = 1, 0  # every rank holds the whole state
            if self.kind == MAMBA2:
                self._plan_mamba2(tp_size, tp_rank, _hf_int(hf_config, "n_groups", "mamba_n_groups"))
            else:
                self._plan_gdn(tp_size, tp_rank, hf_config)
            content = sum(math.prod(s) * _itemsize(d) for s, d in zip(self.shapes, self.dtypes))
            self.content_bytes = content
            self.page_bytes = int(getattr(spec, "page_size_bytes", content))
            if content > self.page_bytes:
                raise _NotRead(f"its states take {content} bytes, more than its page of {self.page_bytes}")
        except _NotRead as e:
            self.why_not = f"{what}: its state is not captured: {e}"

    def _conv_axis(self, channels, what):
        """Whether the conv state is stored (channels, d_conv - 1) ("DS") or (d_conv - 1,
        channels) ("SD", vLLM's default), from which axis is the channels."""
        a, b = self.shapes[0]
        if (a == channels) == (b == channels):
            raise _NotRead(f"a conv state of shape {(a, b)} for {channels} channels ({what}): which axis is the "
                           "channels cannot be told")
        self.dim_first = a == channels

    def _plan_gdn(self, tp, rank, hf):
        """Gated DeltaNet (mamba_utils.py gated_delta_net_state_shape): conv over q | k | v, each
        split over the ranks; recurrent (num_v_heads / tp, head_v_dim, head_k_dim), read as the
        bundle keeps it, [heads, head_k_dim, head_v_dim] (HF's order)."""
        k_heads = _hf_int(hf, "linear_num_key_heads")
        v_heads = _hf_int(hf, "linear_num_value_heads")
        if k_heads is None or v_heads is None:
            raise _NotRead("the model's HF config gives no linear_num_key_heads / linear_num_value_heads, which "
                           "say which conv channels are q, k and v")
        recurrent = self.shapes[1]
        if len(recurrent) != 3 or recurrent[0] * tp != v_heads:
            raise _NotRead(f"a recurrent state of shape {recurrent}, not (num_v_heads {v_heads} / tp {tp}, "
                           "head_v_dim, head_k_dim)")
        heads_r, v_dim, k_dim = recurrent
        key, value = k_heads * k_dim, v_heads * v_dim
        if key % tp or value % tp:
            raise _NotRead(f"q/k ({key}) or v ({value}) channels do not split over tp {tp}")
        self._conv_axis((2 * key + value) // tp, f"q and k {key // tp} each + v {value // tp}")
        q = [rank * (key // tp) + i for i in range(key // tp)]
        v = [2 * key + rank * (value // tp) + i for i in range(value // tp)]
        self.units = {"conv": q + [key + c for c in q] + v, "recurrent": [rank * heads_r + h for h in range(heads_r)]}

    def _plan_mamba2(self, tp, rank, n_groups):
        (a, b), ssm = self.shapes
        if len(ssm) != 3:
            raise _NotRead(f"an ssm state of shape {ssm}, not (heads / tp, head_dim, d_state)")
        heads_r, head_dim, d_state = ssm
        if n_groups is None:
            raise _NotRead("the model's HF config gives no n_groups (or mamba_n_groups), which says which conv "
                           "channels are B and C")
        if n_groups % tp and n_groups != 1:
            raise _NotRead(f"n_groups {n_groups} over tp {tp} (vLLM replicates B and C for one group only)")
        groups_r = n_groups // tp if n_groups % tp == 0 else 1
        channels = heads_r * head_dim + 2 * groups_r * d_state
        self._conv_axis(channels, f"heads {heads_r} x head_dim {head_dim} + 2 x {groups_r} groups x d_state {d_state}")
        intermediate = heads_r * head_dim * tp
        x = [rank * heads_r * head_dim + i for i in range(heads_r * head_dim)]
        owned = range(rank * groups_r, (rank + 1) * groups_r) if n_groups % tp == 0 else range(1)
        bs = [intermediate + g * d_state + j for g in owned for j in range(d_state)]
        cs = [intermediate + (n_groups + g) * d_state + j for g in owned for j in range(d_state)]
        self.units = {"conv": x + bs + cs, "ssm": [rank * heads_r + h for h in range(heads_r)]}

    def check(self, value, num_blocks):
        """The registered cache: the int8 page view [num_blocks, ...] (a block's page in its
        trailing axes), or, from vLLM before the page view, the states themselves (conv, ssm),
        each [num_blocks, *shape]."""
        if self.why_not:
            return
        value = _unwrap(value)
        if isinstance(value, (list, tuple)):
            shapes = [tuple(t.shape[1:]) for t in value]
            if len(value) < 2 or shapes[:2] != self.shapes or any(t.shape[0] < num_blocks for t in value[:2]):
                raise ValueError(f"{self.what}: registered states of shapes {shapes}, the spec says {self.shapes} "
                                 f"per block for {num_blocks} blocks")
            return
        # A block's bytes: the padded page (vLLM's [num_blocks, 1, 1, page_size_bytes] view) or just
        # its states (a view of state_content_size_bytes, the rest of the page in the block stride).
        page = math.prod(value.shape[1:]) * value.element_size()
        if value.dim() < 2 or value.shape[0] < num_blocks or page < self.content_bytes:
            raise ValueError(f"{self.what}: a Mamba page view of shape {tuple(value.shape)} ({value.dtype}); the spec "
                             f"says [num_blocks {num_blocks}, ...] holding {self.content_bytes} bytes of states a block")

    def read(self, value, block_ids):
        """{'conv': [n, channels_r, d_conv - 1], 'ssm': [n, heads_r, head_dim, d_state]} (Gated
        DeltaNet: 'recurrent' [n, heads_r, head_k_dim, head_v_dim]) of the given blocks, on the CPU,
        in the states' dtypes, rows in this rank's unit order."""
        import torch

        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        value = _unwrap(value)
        if isinstance(value, (list, tuple)):
            states = [t[ids.to(t.device)].detach().cpu() for t in value[:2]]
        else:
            pages = value[ids.to(value.device)].detach().reshape(len(ids), -1).view(torch.int8).cpu()
            states, offset = [], 0
            for shape, dtype in zip(self.shapes, self.dtypes):
                nbytes = math.prod(shape) * _itemsize(dtype)
                states.append(pages[:, offset:offset + nbytes].contiguous().view(dtype).view(len(ids), *shape))
                offset += nbytes
        conv, state = states
        if not self.dim_first:
            conv = conv.transpose(1, 2)
        if self.kind == GDN:  # vLLM keeps (head_v_dim, head_k_dim), the bundle HF's (head_k_dim, head_v_dim)
            state = state.transpose(2, 3)
        return {"conv": conv.contiguous(), self.state_part: state.contiguous()}


class _NotRead(Exception):
    pass


def _unwrap(value):
    """Older vLLM registered a list per virtual engine: [(conv, ssm)]."""
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (list, tuple)):
        return value[0]
    return value


def step_checkpoints(mode, block_size, start, end):
    """The (position, slot) of each block-boundary state vLLM keeps from a step that computed the
    positions [start, end): "all" every boundary the step reached, "align" the step's end when it
    is a boundary, "none" none (its one block is the request's latest state)."""
    if mode == "all":
        marks = [((j + 1) * block_size, j) for j in range(start // block_size, (end - 1) // block_size)]
        if end % block_size == 0 and end > start:
            marks.append((end, end // block_size - 1))
        return marks
    if mode == "align" and end % block_size == 0 and end > start:
        return [(end, end // block_size - 1)]
    return []


def final_slot(block_size, num_computed_tokens):
    """The slot of a request's Mamba block table that holds its latest state."""
    return (int(num_computed_tokens) - 1) // int(block_size)
