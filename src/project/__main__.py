"""`python -m project ...`: dispatch only."""

from project.cli import main

if __name__ == "__main__":
    main()
