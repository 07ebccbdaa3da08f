def run(args):
    # TODO: validate args before running
    for arg in args:
        print(arg)  # TODO: use logging instead of print
    # The TODO list for this module lives in the tracker.
    return 0
