"""Tests against a real vLLM engine (CPU build) serving the tiny demo model; see README.md here."""
