"""The GPU timeline: sources of utilization samples (NVML, simulated,
replayed logs), the sampler thread that polls them, the idle detector that
turns samples into idle windows, and nvidia-smi log reading and writing.
Nothing here knows about tool calls.
"""
