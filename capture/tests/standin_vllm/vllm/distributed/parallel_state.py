"""vllm.distributed.parallel_state: the calling worker's ranks. The test harness sets them before
it calls into a worker, as each real worker process has its own."""

import types

_tp_rank = 0
_pp_rank = 0


def set_ranks(tp_rank, pp_rank):
    global _tp_rank, _pp_rank
    _tp_rank, _pp_rank = tp_rank, pp_rank


def get_tensor_model_parallel_rank():
    return _tp_rank


def get_pp_group():
    return types.SimpleNamespace(rank_in_group=_pp_rank)
