"""Helpers the tests share: fake servers, synthetic runs and trend histories, the study's
probe, the project's paths."""
