"""Speculative decoding: the loop, verification, adaptive draft length."""
