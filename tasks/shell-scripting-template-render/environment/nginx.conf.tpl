server {
    listen {{PORT}};
    server_name {{HOST}};
    root {{DOC_ROOT}};
    # {{ NOT_A_PLACEHOLDER }} and {{lower}} stay as they are
}
