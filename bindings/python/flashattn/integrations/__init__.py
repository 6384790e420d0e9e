"""Integrations of flashattn with other libraries, each imported on request:

    from flashattn.integrations.transformers import register   # Hugging Face transformers
"""
