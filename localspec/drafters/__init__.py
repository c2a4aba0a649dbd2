"""Drafters: cheap proposers of the next few tokens, all behind the protocol in base.py."""
