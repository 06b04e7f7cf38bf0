"""The training side computed by the user's trainer: SpecForge's or speculators' own draft class,
loaded through its own loading code, its TTT steps run as that trainer runs them, every stage read
by forward hooks (``registry`` names the trainers; one module per trainer)."""
