"""`python -m harness.isolation.child`: the child process (harness.isolation.child.main)."""

from harness.isolation.child.main import main

if __name__ == "__main__":
    main()
