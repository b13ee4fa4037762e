"""The machinery a learner runs on, apart from any agent: what it learns (``learner_logic``),
data-parallel steps over devices and hosts (``parallel``) and Orbax checkpoints (``checkpoint``)."""
