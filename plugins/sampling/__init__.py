"""Sampling family: the sampler and the rejection sampler."""
