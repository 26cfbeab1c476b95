"""`python -m project ...`: dispatch only. `infer` needs neither torch nor lightning, so it goes first."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["infer"]:
        from project.infer import main

        main(sys.argv[2:])
    else:
        from project.cli import main

        main()
