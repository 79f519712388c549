"""Multi-device NVFP4: partitioning rules for every primitive, and placement of NVFP4 tensors.

jax_nvfp4.quantize / dequantize / matmul / ragged_matmul / conv bind the partitioned primitives
defined here,
so under `jax.jit` with sharded inputs (NamedSharding on a Mesh) each op runs on its shards:

  quantize/dequantize  split by leading dims, whole 128-row tiles, whole 64-element K tiles;
                       dynamic quantize all-reduces the amax (max), so the bytes equal a
                       one-device run.
  matmul               data- (M), column- (N) and row-parallel (K: psum, or psum_scatter when
                       y's rows or columns are asked split over the K axes) and their
                       combinations on meshes of several axes, with no gather of the weight.
  ragged_matmul        expert-parallel (G: each device its groups' rows, then one sum),
                       column- (N) and row-parallel (K: psum of float32 partial sums).
  conv                 batch- (N) and output-channel-parallel (K), no communication, and
                       input-channel-parallel (C: psum of float32 partial convolutions).

Each primitive wraps its inner primitive (jax_nvfp4.primitives) in `custom_partitioning` with a
Shardy sharding rule and the GSPMD callbacks. See docs/sharding.md."""

from jax_nvfp4.sharding.conv import partitioned_conv_p
from jax_nvfp4.sharding.matmul import partitioned_matmul_p
from jax_nvfp4.sharding.placement import nvfp4_sharding, shard_nvfp4
from jax_nvfp4.sharding.quantize import partitioned_dequantize_p, partitioned_quantize_p
from jax_nvfp4.sharding.ragged import partitioned_ragged_matmul_p

__all__ = ["nvfp4_sharding", "shard_nvfp4", "partitioned_quantize_p", "partitioned_dequantize_p",
           "partitioned_matmul_p", "partitioned_ragged_matmul_p", "partitioned_conv_p"]
