"""MultiConnector as vllm/distributed/kv_transfer/kv_connector/v1/multi_connector.py defines it in the
tree of 2026-08-19 (vllm-project/vllm c2057261) and @ 00f4240e: children built from
kv_connector_extra_config["connectors"], every worker call forwarded to each (finish_forward and
handle_preemptions too, each child its own metadata), a request's blocks held while any child holds
them, and reported finished sending once every child that held it has reported it, through the
children's get_transfer_results (get_finished answers from it)."""

import copy
import importlib
import types

from .base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorTransferResults, SupportsHMA


def connector_class(config):
    """KVConnectorFactory.get_connector_class: the class named by kv_connector, from
    kv_connector_module_path."""
    module = importlib.import_module(config["kv_connector_module_path"])
    return getattr(module, config["kv_connector"])


class MultiKVConnectorMetadata(KVConnectorMetadata):
    def __init__(self, metadata):
        self.metadata = tuple(metadata)
        self.extra_async_saves = None


class MultiConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        self._connectors = []
        for ktc in self._kv_transfer_config.kv_connector_extra_config["connectors"]:
            temp_config = copy.copy(vllm_config)
            temp_config.kv_transfer_config = types.SimpleNamespace(
                kv_connector=ktc["kv_connector"], kv_connector_module_path=ktc.get("kv_connector_module_path"),
                kv_role=ktc.get("kv_role"), kv_connector_extra_config=ktc.get("kv_connector_extra_config", {}))
            self._connectors.append(connector_class(ktc)(temp_config, role, kv_cache_config))
        self._extra_async_saves = {}
        self._requests_to_connector = {}
        self._all_support_hma = all(isinstance(c, SupportsHMA) for c in self._connectors)

    # worker side
    def register_kv_caches(self, kv_caches):
        for c in self._connectors:
            c.register_kv_caches(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation):
        for c in self._connectors:
            c.set_host_xfer_buffer_ops(copy_operation)

    def bind_connector_metadata(self, connector_metadata):
        assert isinstance(connector_metadata, MultiKVConnectorMetadata)
        super().bind_connector_metadata(connector_metadata)
        if connector_metadata.extra_async_saves:
            self._extra_async_saves.update(connector_metadata.extra_async_saves)
        for c, cm in zip(self._connectors, connector_metadata.metadata):
            c.bind_connector_metadata(cm)

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        for c in self._connectors:
            c.clear_connector_metadata()

    def start_load_kv(self, forward_context, **kwargs):
        for c in self._connectors:
            c.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name):
        for c in self._connectors:
            c.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        for c in self._connectors:
            c.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self):
        for c in self._connectors:
            c.wait_for_save()

    def shutdown(self):
        for c in self._connectors:
            c.shutdown()

    def finish_forward(self):
        for c in self._connectors:
            c.finish_forward()

    def handle_preemptions(self, kv_connector_metadata):
        assert isinstance(kv_connector_metadata, MultiKVConnectorMetadata)
        for c, cm in zip(self._connectors, kv_connector_metadata.metadata):
            c.handle_preemptions(cm)

    def get_finished(self, finished_req_ids):
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids):
        results = KVConnectorTransferResults()
        for c in self._connectors:
            child = c.get_transfer_results(finished_req_ids)
            results.finished_recving.update(child.finished_recving)
            results.failed_recving.update(child.failed_recving)
            for req_id in child.finished_sending:
                extra_pending = self._extra_async_saves.get(req_id)
                if extra_pending is None:
                    results.finished_sending.add(req_id)
                    continue
                assert extra_pending > 0
                if extra_pending == 1:
                    del self._extra_async_saves[req_id]
                else:
                    self._extra_async_saves[req_id] = extra_pending - 1
        return results

    # scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        to_return = (0, False)
        for i, c in enumerate(self._connectors):
            toks, load_async = c.get_num_new_matched_tokens(request, num_computed_tokens)
            if toks is None:
                return None, False
            if to_return[0] == 0 and toks > 0:
                self._requests_to_connector[request.request_id] = i
                to_return = (toks, load_async)
        return to_return

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        chosen = self._requests_to_connector.get(request.request_id, -1)
        for i, c in enumerate(self._connectors):
            c.update_state_after_alloc(request, blocks, num_external_tokens if i == chosen else 0)

    def build_connector_meta(self, scheduler_output):
        metadata = MultiKVConnectorMetadata(c.build_connector_meta(scheduler_output) for c in self._connectors)
        if self._extra_async_saves:
            metadata.extra_async_saves = self._extra_async_saves
            self._extra_async_saves = {}
        return metadata

    def _aggregate(self, results, request):
        async_saves, params = 0, None
        for held, txfer in results:
            async_saves += bool(held)
            if txfer is not None:
                if params is not None and set(params) & set(txfer):
                    raise RuntimeError(f"Key clash in kv_transfer_params from multiple connectors: "
                                       f"{set(params) & set(txfer)}")
                params = {**(params or {}), **txfer}
        if async_saves > 1:
            self._extra_async_saves[request.request_id] = async_saves - 1
        self._requests_to_connector.pop(request.request_id, None)
        return async_saves > 0, params

    def request_finished(self, request, block_ids):
        return self._aggregate([c.request_finished(request, block_ids) for c in self._connectors], request)

    def request_finished_all_groups(self, request, block_ids):
        if not self._all_support_hma:
            assert len(block_ids) == 1, "HMA with multiple kv_cache_groups requires all sub-connectors to support HMA"
            return self.request_finished(request, block_ids[0])
        return self._aggregate([c.request_finished_all_groups(request, block_ids) for c in self._connectors], request)
