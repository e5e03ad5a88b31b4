"""``llmgw_ctl``'s fleet commands, one module per family: ``nodes``, ``replicas`` (models,
replicas, status, rollout), ``adapters`` (LoRA adapters and where they are loaded),
``logs``, ``weights`` and ``pki`` (the CA, certificates, onboarding), with ``common`` for
what they share (the refusals of an unknown node or model). The dispatcher is
``llmgw_cli/management/commands/llmgw_ctl.py``."""
