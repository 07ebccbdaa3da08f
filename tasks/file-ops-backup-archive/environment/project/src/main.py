from util import greet

if __name__ == "__main__":
  print(greet("world"))
