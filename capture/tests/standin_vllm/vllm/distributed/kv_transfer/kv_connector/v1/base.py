"""KVConnectorBase_V1 as vllm/distributed/kv_transfer/kv_connector/v1/base.py defines it (the
parts a connector implements or calls), as of vllm-project/vllm @ 003df296, the tree of 2026-08-19
(c2057261) and @ 00f4240e: constructor (vllm_config, role, kv_cache_config), register_kv_caches(dict),
set_host_xfer_buffer_ops, request_finished[_all_groups] returning (held, params), get_finished; and
the worker's step hooks of 00f4240e: handle_preemptions, finish_forward, reset_capture_state, and
get_transfer_results, whose default wraps get_finished."""

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        raise NotImplementedError


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


@dataclass
class KVConnectorTransferResults:
    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)
    prefix_replay_checkpoints: dict = field(default_factory=dict)


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is not None:
            self._kv_transfer_config = vllm_config.kv_transfer_config
        else:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self):
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        return

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def finish_forward(self):
        return

    def reset_capture_state(self):
        return

    def handle_preemptions(self, kv_connector_metadata):
        return

    def shutdown(self):
        return None

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs):
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name):
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        return None, None

    def get_transfer_results(self, finished_req_ids):
        finished_sending, finished_recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(finished_sending or ()),
                                          finished_recving=set(finished_recving or ()))

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        pass

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        pass

    def request_finished(self, request, block_ids):
        return False, None
