import sys

from core import engine


def main():
    # TODO: parse command line options
    engine.run(sys.argv[1:])


if __name__ == "__main__":
    main()
