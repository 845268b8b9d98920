"""Helpers the tests share: fixtures' building blocks, servers started in processes, waiting
with a deadline, a headless Chromium. Nothing here is a test."""
