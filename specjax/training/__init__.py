"""Fine-tuning and distillation (optax, orbax): targets, drafts and heads for the shipped pairs."""
