"""`python -m project ...`: dispatch only. infer, serve, report, new, doctor skip LightningCLI: go first."""

import sys

if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["infer"]:
        from project.infer import main

        main(sys.argv[2:])
    elif command == ["serve"]:
        from project.serve.command import main

        main(sys.argv[2:])
    elif command == ["report"]:
        from project.report import main

        main(sys.argv[2:])
    elif command == ["doctor"]:
        from project.doctor import main

        main(sys.argv[2:])
    elif command == ["new"]:
        from project.new import main

        main(sys.argv[2:])
    else:
        from project.cli import main

        main()
