"""KV-cache family: one layout plugin per KV-cache spec kind.

Public surface for other families (import these from here, never from the
family's modules): the int8 BSH page format the Ascend attention backend reads
(its dtype name, the spec test and the page split) and whether a model's MLA
layers are sparse (SFA), which the attention backend choice needs.
"""

from ascend_kernel_plugins.kv_cache.int8_bsh import INT8_KV_CACHE_DTYPE, Int8BSHCaches, bsh_parts, bsh_spec
from ascend_kernel_plugins.kv_cache.mla import is_sparse_model

__all__ = ["INT8_KV_CACHE_DTYPE", "Int8BSHCaches", "bsh_parts", "bsh_spec", "is_sparse_model"]
