"""Code execution for rewards: rlpost's sandbox service (SandboxFusion's HTTP API over Linux namespaces and
rlimits), the client the code scorers use, and the local service the trainer starts for
`reward_model.sandbox_fusion.url=local`. See docs/sandbox.md."""

LOCAL = "local"  # the `sandbox_fusion.url` value that makes the trainer start its own service
