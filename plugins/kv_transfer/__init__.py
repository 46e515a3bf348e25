"""Prefill/decode disaggregation: the kernel's side of vLLM's KV connectors (Mooncake over TCP or RDMA).

The kernel brings no transport: vLLM's ``MooncakeConnector`` moves the pages.
This plugin makes it run on the kernel's platforms (a device index on a CPU
host, a counted transfer for the report) and refuses, at start-up, what the
kernel cannot hand it.
"""
