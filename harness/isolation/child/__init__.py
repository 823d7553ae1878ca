"""The child side: the process a case body runs in (`python -m harness.isolation.child`, main.py:
its loop and watchdog) and what a body gets there (context).
"""
