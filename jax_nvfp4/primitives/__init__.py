"""JAX primitives of jax_nvfp4: abstract eval, batching, and lowering per platform.

Each primitive lowers on CUDA to an XLA FFI custom call into the compiled extension when a kernel
for the GPU exists, and everywhere else to the pure-JAX reference (jax_nvfp4.reference)."""
