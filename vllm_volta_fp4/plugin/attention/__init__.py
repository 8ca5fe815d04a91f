"""The VOLTA_HMMA attention backend and the platform plugin that makes it vLLM's default on compute capability 7.x.
Imports nothing from vLLM: ``platform_choice`` runs while vLLM resolves its platform."""
