"""Runtime support for generated code: loading, caching and launching kernels."""
