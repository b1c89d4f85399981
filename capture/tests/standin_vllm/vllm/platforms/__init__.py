"""vllm.platforms.current_platform: the platform's fp8 type (vllm/platforms/rocm.py: e4m3fnuz on
MI300, e4m3fn elsewhere). The stand-in gives its name, so that it works with a torch without fp8
types; tests set `fp8` to stand for a ROCm machine."""


class _Platform:
    fp8 = "torch.float8_e4m3fn"

    def fp8_dtype(self):
        return self.fp8


current_platform = _Platform()
