"""`python -m project ...`: dispatch only. `infer` and `new` need no torch or lightning, so they go first."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["infer"]:
        from project.infer import main

        main(sys.argv[2:])
    elif sys.argv[1:2] == ["new"]:
        from project.new import main

        main(sys.argv[2:])
    else:
        from project.cli import main

        main()
