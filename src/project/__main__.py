"""`python -m project ...`: dispatch only. `infer` and `report` need neither torch nor lightning."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["infer"]:
        from project.infer import main

        main(sys.argv[2:])
    elif sys.argv[1:2] == ["report"]:
        from project.report import main

        main(sys.argv[2:])
    else:
        from project.cli import main

        main()
