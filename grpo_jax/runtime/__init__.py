"""The runtime under the rollout and the training loop: devices and meshes (`sharding`), processes
(`distributed`), JAX's persistent compilation cache (`compile_cache`) and this process's memory (`memory`).
Imports nothing of grpo_jax above the neutral modules, the config and the host-side code packages."""
